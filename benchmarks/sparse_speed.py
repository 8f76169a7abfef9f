"""The learned sparse stage's speed on a corpus no index has seen, against retr's dense index and against the plain
sentence-transformers way (``SparseEncoder.encode`` + ``semantic_search_seismic``), all in one run.

    python benchmarks/sparse_speed.py --sparse-model SPARSE_DIR [--corpus BEIR_DIR] [--docs 1000] [--queries 100]

Builds, each a whole fresh process (first runs included, nothing cached): `retr index --no-bm25` (dense only) and
the same with `--sparse-model` (dense + sparse; the manifest's parts give each part's seconds); the peer encodes the
documents with ``SparseEncoder.encode_document`` and builds its Seismic index through ``semantic_search_seismic``.
Queries, each alone after a warm-up, in one child each: retr's dense, splade (exact CSR) and splade (seismic)
stages, and the peer's ``encode_query`` + ``semantic_search_seismic`` against its index. Also the recall@10 of
retr's seismic search against its exact one. Results JSON under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from common import command_line, cpu, percentiles, run_child, run_measured, table, write_result

HERE = Path(__file__).resolve()


def _sample(corpus: Path, docs: int, queries: int, out: Path, seed: int = 0) -> tuple[Path, Path]:
    """The first ``docs`` documents of a BEIR corpus (its order) and ``queries`` of its queries (seeded)."""
    lines = corpus.joinpath("corpus.jsonl").read_text(encoding="utf-8").splitlines()[:docs]
    out.mkdir(parents=True, exist_ok=True)
    (out / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    qs = [json.loads(x)["text"] for x in corpus.joinpath("queries.jsonl").read_text(encoding="utf-8").splitlines()]
    random.Random(seed).shuffle(qs)
    (out / "queries.json").write_text(json.dumps(qs[:queries]))
    return out / "corpus.jsonl", out / "queries.json"


def _child_retr(folder: str, queries_file: str, warmup: int) -> dict:
    from retr.indexes.folder import IndexFolder
    from retr.retrieval.compose import IndexParts, build
    from retr.retrieval.pipeline import PipelineConfig, parse

    queries = json.loads(Path(queries_file).read_text())
    out = {}
    for mode, engine in (("dense", "exact"), ("splade", "exact"), ("splade", "seismic")):
        index = IndexFolder(folder)
        t0 = time.perf_counter()
        retriever = build(parse(mode), IndexParts(index), PipelineConfig(sparse_engine=engine))
        for q in queries[:warmup]:
            retriever.search({"w": q}, 10)
        first = time.perf_counter() - t0  # the model loaded (and the seismic index built) and the warm-up
        samples, runs = [], {}
        for i, q in enumerate(queries):
            t = time.perf_counter()
            runs[i] = [h.doc_id for h in retriever.search({str(i): q}, 10)[str(i)]]
            samples.append(time.perf_counter() - t)
        out[f"{mode}-{engine}" if mode == "splade" else mode] = {"query_ms": percentiles(samples, 1000.0),
                                                                 "open_and_warmup_seconds": first, "runs": runs}
        index.close()
    exact, approx = out["splade-exact"]["runs"], out["splade-seismic"]["runs"]
    out["seismic_recall@10_vs_exact"] = sum(len(set(exact[i]) & set(approx[i])) / max(1, len(exact[i]))
                                            for i in exact) / len(exact)
    for v in out.values():
        if isinstance(v, dict):
            v.pop("runs", None)
    return out


def _child_peer(model: str, corpus_file: str, queries_file: str, warmup: int) -> dict:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.search_engines import semantic_search_seismic

    t0 = time.perf_counter()
    docs = [json.loads(x) for x in Path(corpus_file).read_text(encoding="utf-8").splitlines()]
    texts = [f"{d.get('title', '')} {d['text']}".strip() for d in docs]
    enc = SparseEncoder(model, device="cpu", local_files_only=True)
    emb = enc.encode_document(texts, batch_size=32)
    decoded = enc.decode(emb)
    queries = json.loads(Path(queries_file).read_text())
    _, _, index = semantic_search_seismic(enc.decode(enc.encode_query(queries[:1])), corpus_embeddings_decoded=decoded,
                                          top_k=10, output_index=True)
    build = time.perf_counter() - t0
    for q in queries[:warmup]:
        semantic_search_seismic(enc.decode(enc.encode_query([q])), corpus_index=index, top_k=10)
    samples = []
    for q in queries:
        t = time.perf_counter()
        semantic_search_seismic(enc.decode(enc.encode_query([q])), corpus_index=index, top_k=10)
        samples.append(time.perf_counter() - t)
    return {"build_seconds_in_process": build, "query_ms": percentiles(samples, 1000.0)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sparse-model", help="a SparseEncoder folder (required)")
    p.add_argument("--corpus", default="../shared/datasets/cranfield", help="BEIR folder the documents come from")
    p.add_argument("--docs", type=int, default=1000)
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results/sparse-speed-avx2-epyc.json")
    p.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        kind, *rest = a.args
        print(json.dumps(_child_retr(*rest, a.warmup) if kind == "retr" else _child_peer(*rest, a.warmup)))
        return 0
    if not a.sparse_model:
        p.error("--sparse-model is required")
    model = str(Path(a.sparse_model).resolve())
    with tempfile.TemporaryDirectory(prefix="retr-sparse-speed-") as tmp:
        tmp = Path(tmp)
        corpus, queries = _sample(Path(a.corpus), a.docs, a.queries, tmp / "data")
        env = {"RETR_CACHE": str(tmp / "cache")}  # nothing cached: every build encodes
        dense = run_measured("retr", ["index", "--corpus", str(corpus), "--out", str(tmp / "dense"), "--no-bm25",
                                      "--no-cache"], tmp / "dense.log", env)
        both = run_measured("retr", ["index", "--corpus", str(corpus), "--out", str(tmp / "sparse"), "--no-bm25",
                                     "--no-cache", "--sparse-model", model], tmp / "sparse.log", env)
        manifest = json.loads((tmp / "sparse" / "manifest.json").read_text())
        dense_only = json.loads((tmp / "dense" / "manifest.json").read_text())
        t0 = time.perf_counter()
        peer = run_child(HERE, [f"--warmup={a.warmup}", "peer", model, str(corpus), str(queries)], env)
        peer["process_seconds"] = time.perf_counter() - t0
        retr_q = run_child(HERE, [f"--warmup={a.warmup}", "retr", str(tmp / "sparse"), str(queries)], env)
    sparse_part = manifest["sparse"]
    result = {
        "cpu": cpu(), "command": command_line(), "docs": a.docs, "queries": a.queries, "corpus": a.corpus,
        "sparse_model": model, "sparse_kind": sparse_part["model"]["kind"],
        "build": {"dense_index_process_seconds": dense["seconds"], "dense_plus_sparse_process_seconds": both["seconds"],
                  "sparse_process_seconds_added": both["seconds"] - dense["seconds"],
                  "dense_part_seconds": dense_only["dense"]["build_seconds"],
                  "sparse_part_seconds": sparse_part["build_seconds"], "sparse_bytes": sparse_part["bytes"],
                  "dense_bytes": dense_only["dense"]["bytes"], "mean_nnz_per_doc": sparse_part["mean_nnz_per_doc"],
                  "peer_process_seconds": peer["process_seconds"],
                  "peer_build_seconds_in_process": peer["build_seconds_in_process"]},
        "query": {**{k: v for k, v in retr_q.items()}, "peer_seismic": peer["query_ms"]},
    }
    b = result["build"]
    result["ratios"] = {
        "sparse_part_over_dense_part_build": b["sparse_part_seconds"] / b["dense_part_seconds"],
        "sparse_added_process_over_dense_process": b["sparse_process_seconds_added"] / b["dense_index_process_seconds"],
        "splade_exact_p50_over_dense_p50": retr_q["splade-exact"]["query_ms"]["p50"] / retr_q["dense"]["query_ms"]["p50"],
        "splade_seismic_p50_over_peer_p50": retr_q["splade-seismic"]["query_ms"]["p50"] / peer["query_ms"]["p50"],
    }
    rows = [[k, v["query_ms"]["p50"], v["query_ms"]["p95"]] for k, v in retr_q.items() if isinstance(v, dict)]
    rows.append(["peer encode_query + semantic_search_seismic", peer["query_ms"]["p50"], peer["query_ms"]["p95"]])
    print(table(f"query latency, ms ({result['cpu']})", ["stage", "p50", "p95"], rows))
    print(json.dumps(result["build"], indent=1))
    print(json.dumps(result["ratios"], indent=1))
    write_result(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
