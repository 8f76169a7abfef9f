"""Peak memory of `retr eval` over a large corpus: is exact dense search bounded by the embeddings it searches?

    python benchmarks/eval_memory.py [--docs 1000000] [--small 2000] [--queries 300] [--work /tmp/eval-memory]
                                     [--out benchmarks/results/eval-memory.json]

A synthetic BEIR dataset of ``--docs`` short documents (random words from a 5,000-word vocabulary), ``--queries``
queries and one judged document each. Encoding a million documents takes hours on 2 cores, so the embedding
cache is filled beforehand under the very key `retr eval` looks up (the model's hash, the corpus checksum, max
length, backend), with vectors made from real SciFact embeddings (``synthetic_blocks``): eval then builds the flat
index and BM25 from the cache and searches, as it would after encoding. Each `retr eval --pipelines dense` runs in
its own process, which reports its own peak RSS (VmHWM). Three runs: the large corpus with no index yet
(build + search), again with its index cached (search only), and a ``--small`` corpus of the same kind: the
process with the model, the graphs and the libraries loaded, the "plus the model" of the bound. The goal (issue
14): peak(large) <= peak(small) + 1.5 x the embeddings' bytes. The cache entries it made are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np


def write_dataset(folder: Path, docs: int, queries: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(5000)])
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w") as fh:
        for start in range(0, docs, 100_000):
            m = min(100_000, docs - start)
            words = vocab[rng.integers(0, len(vocab), (m, 12))]
            for i in range(m):
                fh.write(json.dumps({"_id": f"d{start + i}", "title": "", "text": " ".join(words[i])}) + "\n")
    judged = rng.integers(0, docs, queries)
    with open(folder / "queries.jsonl", "w") as fh:
        for q in range(queries):
            fh.write(json.dumps({"_id": f"q{q}", "text": " ".join(vocab[rng.integers(0, len(vocab), 4)])}) + "\n")
    with open(folder / "qrels" / "test.tsv", "w") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for q, d in enumerate(judged.tolist()):
            fh.write(f"q{q}\td{d}\t1\n")


def fill_cache(folder: Path, base: np.ndarray, work: Path) -> tuple[Path, int]:
    """Put synthetic embeddings for ``folder``'s corpus where `retr eval` will look for them; (entry, bytes).
    Made block by block into a file under ``work`` and stored by the cache's own ``save``: never whole in RAM."""
    from lean_ann import make_vectors

    from retr.indexes.build import IndexConfig, index_texts
    from retr.indexes.cache import EmbeddingCache, embedding_key
    from retr.indexes.corpus import load_corpus
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    corpus = load_corpus(folder / "corpus.jsonl")
    encoder = BiEncoder(EncoderConfig())
    texts = index_texts(encoder, corpus, IndexConfig().passages)
    key = embedding_key(encoder.model_hash, texts.sha256, encoder.max_length,
                        encoder.planner.graph_id(texts.texts), encoder.prompts.document)
    vectors = make_vectors(base, len(corpus), work / f"vectors-{len(corpus)}.npy")
    cache = EmbeddingCache()
    cache.save(key, vectors, {"model": encoder.model_id, "model_hash": encoder.model_hash, "backend": encoder.backend,
                              "corpus_sha256": texts.sha256, "max_length": encoder.max_length,
                              "doc_prompt": encoder.prompts.document, "graph": None, "synthetic": True})
    return cache.path(key), vectors.nbytes


def measured_eval(folder: Path, out: Path) -> dict:
    from common import run_measured

    args = ["eval", "--dataset", str(folder), "--modes", "dense", "--no-download", "--out", str(out)]
    measured = run_measured("retr", args, out.with_suffix(".stderr"))
    report = json.loads(out.read_text())
    return {"command": " ".join(["retr", *args]), **measured,
            "ndcg@10": next((v for k, v in report["pipelines"]["dense"]["metrics"].items()
                             if k.lower() == "ndcg@10"), None)}


def main(argv: list[str] | None = None) -> int:
    from lean_ann import _queries_and_base

    from retr.retrieval.artifacts import cache_home

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--work", default="/tmp/eval-memory")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "eval-memory.json"))
    args = ap.parse_args(argv)
    from common import command_line

    print("command:", command_line(), flush=True)
    work = Path(args.work)
    base, _ = _queries_and_base()
    made: list[Path] = []
    results: dict = {"docs": args.docs, "small_docs": args.small, "queries": args.queries, "cores": os.cpu_count()}
    try:
        runs = {}
        for label, docs in (("small", args.small), ("large", args.docs)):
            folder = work / f"synthetic-{docs}"
            if folder.exists():
                shutil.rmtree(folder)
            write_dataset(folder, docs, args.queries)
            entry, nbytes = fill_cache(folder, base, work)
            made.append(entry)
            before = set((cache_home() / "indexes").glob(f"{folder.name}-*"))
            runs[label] = measured_eval(folder, work / f"{label}.json")
            made.extend(set((cache_home() / "indexes").glob(f"{folder.name}-*")) - before)
            results[f"{label}_embedding_bytes"] = nbytes
            if label == "large":
                runs["large_index_cached"] = measured_eval(folder, work / "large-cached.json")
            print(label, runs[label], flush=True)
        results["runs"] = runs
        emb_mb = results["large_embedding_bytes"] / 2**20
        bound = runs["small"]["peak_rss_mb"] + 1.5 * emb_mb
        results["bound_mb"] = bound
        results["embeddings_mb"] = emb_mb
        for label in ("large", "large_index_cached"):
            over = runs[label]["peak_rss_mb"] - runs["small"]["peak_rss_mb"]
            results[f"{label}_over_small_in_embeddings"] = over / emb_mb
            print(f"{label}: peak RSS {runs[label]['peak_rss_mb']:.0f} MB = small-corpus process "
                  f"{runs['small']['peak_rss_mb']:.0f} MB + {over / emb_mb:.2f} x the embeddings ({emb_mb:.0f} MB); "
                  f"bound {bound:.0f} MB: {'met' if runs[label]['peak_rss_mb'] <= bound else 'NOT met'}", flush=True)
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)
    from common import write_result

    write_result(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
