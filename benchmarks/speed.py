"""retr against its peers, side by side in one run, on this machine. A script, not a test.

    python benchmarks/speed.py [--sections 1,2,3,4,5,6,7] [--dataset ../shared/datasets/scifact]
                               [--encode-docs N] [--quality] [--reranker DIR] [--rerank-queries 30]
                               [--ann-n 1000000] [--out benchmarks/results/speed.json]

Sections (as numbered in the speed issue):
  1  corpus encoding docs/s: sentence-transformers fp32 vs retr's backends (+ nDCG@10 with --quality)
  2  single-query first-stage latency (encode + exact search, k=10): sentence-transformers + FAISS vs retr
  3  rerank latency p50 and nDCG@10 at depths 10/20/50/100 over BM25's ranking: sentence-transformers
     CrossEncoder fp32 vs retr's reranker (backends, max lengths); the reference is the same model over
     the top 100 in fp32 (``--reranker``: a cross-encoder folder; default: the bundled MiniLM with a
     new one-logit head, seed 0 -- speed does not depend on the head, its nDCG means nothing)
  4  BM25 ms/query: rank_bm25 vs bm25s vs retr
  5  end to end: `retr eval --pipelines dense` (cold cache) vs BEIR's EvaluateRetrieval +
     DenseRetrievalExactSearch with the same model, each in its own process: wall time, peak RSS, nDCG@10
  6  ANN at scale: flat vs HNSW (several efSearch) vs IVF-PQ (several nprobe) on vectors made from
     real SciFact embeddings (see ``synthetic_vectors``): recall@10, single-query QPS, bytes/vector,
     build time, and the curve as a PNG
  7  first run on a new corpus (``--first-docs``, default 1,000): `retr index` vs sentence-transformers fp32
     + FAISS flat (benchmarks/st_index.py), whole processes timed from outside, graphs already exported, no
     embeddings cached; ``--fresh``: also `retr index` on an empty cache in every round (median of them), then
     again on the cache it left (a user's next corpus), and the first command (`retr eval --dataset`) once on one
     (as on a fresh machine), then once more
Prints a table per section with absolute figures and retr/peer ratios, and writes all numbers to JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from common import percentiles, run_measured, table, write_result


def percentiles_ms(samples_s: list[float]) -> dict:
    """Latency percentiles in ms of ``samples_s`` seconds."""
    return percentiles(samples_s, scale=1000.0)


def section_encoding(ds, n_docs: int, quality: bool, backends: tuple[str, ...]) -> dict:
    from sentence_transformers import SentenceTransformer

    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.models import bundled_model_path

    texts = [d.full_text() for d in ds.corpus.docs][:n_docs]
    out = {}
    st = SentenceTransformer(str(bundled_model_path()), device="cpu")
    st.encode(texts[:32])
    t0 = time.perf_counter()
    st_emb = st.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
    out["sentence-transformers fp32"] = {"docs_per_s": len(texts) / (time.perf_counter() - t0), "emb": st_emb}
    encoders = {"sentence-transformers fp32": None}
    for backend in backends:
        enc = BiEncoder(EncoderConfig(backend=backend))
        encoders[f"retr {backend}"] = enc
        # a first pass warms up and does the one-time work (openvino-int8: calibration on this corpus, unless
        # cached); the second pass is timed
        t0 = time.perf_counter()
        enc.encode_corpus(texts)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        encoded = enc.encode_corpus(texts)
        emb = encoded.embeddings
        out[f"retr {backend}"] = {"docs_per_s": len(texts) / (time.perf_counter() - t0), "emb": emb,
                                  "first_pass_s": first, "min_cos_to_st": float((emb * st_emb).sum(1).min()),
                                  "graph": encoded.graph, "queries": enc.describe_queries()["backend"]}
    if quality and n_docs >= len(ds.corpus):
        from retr.eval.metrics import evaluate
        from retr.retrieval.types import Run

        for name, r in out.items():
            enc = encoders[name]
            q = enc.encode_queries(list(ds.queries.values())) if enc is not None else \
                st.encode(list(ds.queries.values()), normalize_embeddings=True, convert_to_numpy=True)
            scores = q @ r["emb"].T
            top = np.argsort(-scores, axis=1)[:, :10]
            run = Run({qid: [(ds.corpus.ids[j], float(scores[i, j])) for j in top[i]]
                       for i, qid in enumerate(ds.queries)})
            r["ndcg@10"] = evaluate(run, ds.qrels, [10]).mean["NDCG@10"]
    base = out["sentence-transformers fp32"]["docs_per_s"]
    rows = [[k, v.get("graph", {}).get("precision", "fp32"), v["docs_per_s"], v["docs_per_s"] / base,
             v.get("first_pass_s", "-"), v.get("min_cos_to_st", 1.0), v.get("queries", "torch"),
             v.get("ndcg@10", "-")] for k, v in out.items()]
    print(table(f"1. corpus encoding, {len(texts)} SciFact docs (max length 256)",
                 ["encoder", "precision", "docs/s", "ratio vs ST", "first pass s", "min cos vs ST", "queries by",
                  "nDCG@10"], rows), "\n")
    return {k: {kk: vv for kk, vv in v.items() if kk != "emb"} for k, v in out.items()}


def child_retr_queries(dataset: str, n_queries: str, query_backend: str = "") -> dict:
    """Section 2's retr side, in its own process as `retr search` runs (no torch imported); ``query_backend``:
    '' for the default."""
    import faiss

    from retr.eval.data import load_dataset
    from retr.eval.runner import run_pipeline
    from retr.indexes.build import corpus_embeddings
    from retr.retrieval.dense import DenseRetriever
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    ds = load_dataset(dataset, "test", download=False)
    enc = BiEncoder(EncoderConfig(query_backend=query_backend or None))
    emb, _ = corpus_embeddings(enc, ds.corpus)
    index = faiss.IndexFlatIP(emb.shape[1])
    index.add(np.ascontiguousarray(emb))
    queries = dict(list(ds.queries.items())[:int(n_queries)])
    _, timings = run_pipeline(DenseRetriever(index, ds.corpus.ids, enc), queries, 10, warmup=5)
    return {"queries_by": enc.describe_queries()["backend"], "samples": list(timings.values())}


def _child(name: str, *args: str, env: dict | None = None) -> dict:
    """Run ``child_<name>(*args)`` of this file in a fresh Python process; its result is its last stdout line."""
    import subprocess

    proc = subprocess.run([sys.executable, __file__, "--child", name, *args], capture_output=True, text=True,
                          env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} process failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def section_query_latency(ds, n_queries: int) -> dict:
    """retr in its own process, as `retr search` runs (no torch: a query needs the tokenizer and the cached
    graph; measured here, torch's thread pool in the same process slows an ONNX Runtime query ~1.4x), then
    sentence-transformers + FAISS in this one."""
    import faiss
    from sentence_transformers import SentenceTransformer

    from retr.indexes.build import corpus_embeddings
    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.models import bundled_model_path

    enc = BiEncoder(EncoderConfig())
    emb, _ = corpus_embeddings(enc, ds.corpus)  # cached here for the child process too
    children = [_child("retr_queries", str(ds.path), str(n_queries), qb) for qb in ("", "onnx-int8")]
    index = faiss.IndexFlatIP(emb.shape[1])
    index.add(np.ascontiguousarray(emb))
    queries = list(ds.queries.items())[:n_queries]
    st = SentenceTransformer(str(bundled_model_path()), device="cpu")
    peer = []
    for _, text in queries[:5]:
        st.encode([text])
    for _, text in queries:
        t0 = time.perf_counter()
        v = st.encode([text], normalize_embeddings=True, convert_to_numpy=True)
        index.search(v, 10)
        peer.append(time.perf_counter() - t0)
    res = {"sentence-transformers + faiss flat": percentiles_ms(peer)}
    for i, child in enumerate(children):
        label = f"{child['queries_by']}{'' if i else ', default'}"  # the two children may run the same graph
        name = f"retr (queries: {label}, own process) + faiss flat"
        res[name] = percentiles_ms([s["total"] for s in child["samples"]])
        res[f"  encode ({label})"] = percentiles_ms([s["encode"] for s in child["samples"]])
        res[f"  search ({label})"] = percentiles_ms([s["ann"] for s in child["samples"]])
    rows = [[k, v["p50"], v["p95"]] for k, v in res.items()]
    print(table(f"2. single-query first stage, {len(queries)} SciFact queries, k=10, warm",
                 ["path", "p50 ms", "p95 ms"], rows))
    peer_p50 = res["sentence-transformers + faiss flat"]["p50"]
    for name in (k for k in res if k.startswith("retr")):
        print(f"   ratio {name} / peer p50: {res[name]['p50'] / peer_p50:.2f}")
    print()
    return res


def head_cross_encoder(folder: Path) -> Path:
    """The bundled MiniLM with a new one-logit head (seed 0): a cross-encoder whose speed is a trained one's."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    from retr.retrieval.models import bundled_model_path

    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(str(bundled_model_path()), num_labels=1)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(bundled_model_path())).save_pretrained(folder)
    return folder


def section_rerank(ds, reranker_dir: str | None, n_queries: int, depths=(10, 20, 50, 100),
                   lengths: tuple[int, ...] = (256, 128), backends: tuple[str, ...] = ("openvino", "onnx-int8")) -> dict:
    import tempfile

    from sentence_transformers import CrossEncoder

    from retr.eval.metrics import evaluate
    from retr.retrieval.backends.export import ce_logits
    from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig
    from retr.retrieval.types import Hit, Qrels, Run
    from retr.train.negatives import temporary_bm25

    folder = Path(reranker_dir) if reranker_dir else head_cross_encoder(Path(tempfile.mkdtemp()) / "ce")
    qids = [q for q in ds.queries if q in ds.qrels][:n_queries]
    queries = {q: ds.queries[q] for q in qids}
    qrels = Qrels({q: ds.qrels[q] for q in qids})
    with temporary_bm25(ds.corpus.ids, [d.full_text() for d in ds.corpus.docs]) as bm25:
        first = bm25.search(queries, max(depths))
    text = {d.doc_id: d.full_text() for d in ds.corpus.docs}

    def run_path(name, score_fn, max_length):
        rows = []
        for q in qids[:3]:  # warm-up, untimed
            score_fn(queries[q], [text[h.doc_id] for h in first[q][:10]])
        for depth in depths:
            times, ranked = [], {}
            for q in qids:
                head = first[q][:depth]
                t0 = time.perf_counter()
                scores = score_fn(queries[q], [text[h.doc_id] for h in head])
                times.append(time.perf_counter() - t0)
                ranked[q] = [Hit(h.doc_id, float(s)) for h, s in zip(head, scores, strict=True)]
            rows.append({"path": name, "max_length": max_length, "depth": depth, **percentiles_ms(times),
                         "ndcg@10": evaluate(Run(ranked), qrels, [10]).mean["NDCG@10"]})
        return rows

    rows = []
    for max_length in dict.fromkeys((256, *lengths)):  # 256: the reference's length
        peer = CrossEncoder(str(folder), max_length=max_length, device="cpu")
        rows += run_path("sentence-transformers fp32", lambda q, t, m=peer: ce_logits(m, [(q, x) for x in t]),
                         max_length)
        del peer
        for backend in backends:
            r = CrossEncoderReranker(RerankConfig(model=str(folder), max_length=max_length, backend=backend))
            rows += run_path(f"retr {backend} ({r.precision})", r.score, max_length)
    ref = next(r for r in rows if r["path"].startswith("sentence-transformers") and r["max_length"] == 256
               and r["depth"] == max(depths))
    base = {(r["max_length"], r["depth"]): r["p50"] for r in rows if r["path"].startswith("sentence")}
    for r in rows:
        r["ndcg_vs_ref"] = r["ndcg@10"] - ref["ndcg@10"]
        r["p50_ratio_vs_st"] = r["p50"] / base[(r["max_length"], r["depth"])]
    first_ndcg = evaluate(Run({q: first[q][:10] for q in qids}), qrels, [10]).mean["NDCG@10"]
    print(table(f"3. reranking BM25's top-k, {len(qids)} SciFact queries, warm (reference: ST fp32, depth "
                 f"{max(depths)}, max length 256, nDCG@10 {ref['ndcg@10']:.4f}; BM25 alone {first_ndcg:.4f}; "
                 f"model {'given' if reranker_dir else 'MiniLM + untrained head: nDCG meaningless'})",
                 ["path", "max len", "depth", "p50 ms", "p95 ms", "p50 vs ST", "nDCG@10", "vs ref"],
                 [[r["path"], r["max_length"], r["depth"], r["p50"], r["p95"], r["p50_ratio_vs_st"], r["ndcg@10"],
                   r["ndcg_vs_ref"]] for r in rows]), "\n")
    return {"model": str(folder), "trained": bool(reranker_dir), "queries": len(qids), "bm25_ndcg@10": first_ndcg,
            "rows": rows}


def peak_rss_mb() -> float:
    """This process's own high-water mark (ru_maxrss is carried over fork + exec from the parent)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_beir_e2e(dataset: str, model: str) -> dict:
    t0 = time.perf_counter()
    from beir.datasets.data_loader import GenericDataLoader
    from beir.retrieval import models
    from beir.retrieval.evaluation import EvaluateRetrieval
    from beir.retrieval.search.dense import DenseRetrievalExactSearch as DRES

    corpus, queries, qrels = GenericDataLoader(data_folder=dataset).load(split="test")
    retriever = EvaluateRetrieval(DRES(models.SentenceBERT(model), batch_size=32), score_function="cos_sim",
                                  k_values=[1, 3, 5, 10, 100, 1000])
    results = retriever.retrieve(corpus, queries)
    ndcg, _map, recall, p = retriever.evaluate(qrels, results, retriever.k_values, ignore_identical_ids=False)
    return {"wall_s": time.perf_counter() - t0, "ndcg@10": ndcg["NDCG@10"], "peak_rss_mb": peak_rss_mb()}


def child_retr_e2e(dataset: str, report_path: str) -> dict:
    t0 = time.perf_counter()
    from retr.cli.main import main as retr_main
    from retr.eval.report import EvalReport

    rc = retr_main(["-q", "eval", "--dataset", dataset, "--modes", "dense", "--out", report_path])
    report = EvalReport.read(report_path)
    return {"wall_s": time.perf_counter() - t0, "rc": rc, "ndcg@10": report.pipelines["dense"].metrics["NDCG@10"],
            "peak_rss_mb": peak_rss_mb()}


def section_end_to_end(dataset: str) -> dict:
    """Each pipeline in a fresh process (peak RSS is the process's own); retr with an empty embedding cache
    (the verified OpenVINO export of the model is reused: exported once per model, like a model download)."""
    import shutil
    import tempfile

    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.models import bundled_model_path

    res = {}
    tmp = Path(tempfile.mkdtemp())
    cache = tmp / "cache"
    (cache / "onnx").mkdir(parents=True)
    for graph in (cache_home() / "onnx").glob("*"):
        shutil.copytree(graph, cache / "onnx" / graph.name)
    env = {**os.environ, "RETR_CACHE": str(cache), "TOKENIZERS_PARALLELISM": "false"}
    for name, child, args in (("BEIR EvaluateRetrieval + DRES (sentence-transformers)", "beir_e2e",
                               [dataset, str(bundled_model_path())]),
                              ("retr eval --pipelines dense (cold embedding cache)", "retr_e2e",
                               [dataset, str(tmp / "report.json")])):
        res[name] = _child(child, *args, env=env)
    shutil.rmtree(tmp, ignore_errors=True)
    peer, ours = res.values()
    print(table("5. end to end on SciFact test (dense, exact search, k up to 1000), one process each",
                 ["pipeline", "wall s", "peak RSS MB", "nDCG@10"],
                 [[k, v["wall_s"], v["peak_rss_mb"], v["ndcg@10"]] for k, v in res.items()]))
    print(f"   ratio retr/BEIR: wall {ours['wall_s'] / peer['wall_s']:.2f}, "
          f"peak RSS {ours['peak_rss_mb'] / peer['peak_rss_mb']:.2f}\n")
    return res


def new_corpus(dataset: str, n: int, out: Path, seed: int = 7) -> Path:
    """``n`` documents of ``dataset`` drawn with ``seed``, in a corpus file no cache has seen."""
    lines = Path(dataset, "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    keep = np.sort(np.random.default_rng(seed).choice(len(lines), min(n, len(lines)), replace=False))
    out.write_text("".join(lines[i] + "\n" for i in keep), encoding="utf-8")
    return out


def section_first_run(dataset: str, n_docs: int, repeats: int, fresh: bool, backend: str | None = None,
                      first_command: bool = True) -> dict:
    """`retr index` on a new corpus against sentence-transformers fp32 encoding the same documents into a FAISS
    flat index, each a whole process (start-up, imports, model load, encoding, writing), timed from outside, with
    the model's graphs already exported (as after a first run: once per model) and no embeddings cached: once with
    their speeds not yet timed on this machine (the run times them, ~4 s, and stores them) and once with them
    stored (by that run: any later corpus). ``fresh``: also `retr index` of the same corpus on an empty cache in every round (the graphs made, checked and
    calibrated where that pays, in the run, as on a fresh machine) and then again on the cache that run left (a
    user's next corpus), and the README's first command once on one, then once more (its index cached)."""
    import shutil
    import tempfile

    from retr.retrieval.artifacts import cache_home
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    # the graphs a first run would have exported and calibrated, made now
    enc = BiEncoder(EncoderConfig(**({"backend": backend} if backend else {})))
    graphs = {"documents": (enc.calibrated_graph or enc.graph).info(), "queries": enc.describe_queries()}
    tmp = Path(tempfile.mkdtemp(prefix="retr-first-run-"))
    corpus = new_corpus(dataset, n_docs, tmp / "corpus.jsonl")

    def index_args(out: Path) -> list[str]:
        return ["index", "--corpus", str(corpus), "--out", str(out), *(["--backend", backend] if backend else [])]

    cache = tmp / "cache"
    cache.mkdir()
    (cache / "onnx").symlink_to(cache_home() / "onnx")
    runs: dict[str, list] = {"retr": [], "retr_timed": [], "st": [],
                             **({"fresh": [], "second": []} if fresh else {})}
    for r in range(repeats):  # alternating, so that drift on a shared machine hits all alike
        shutil.rmtree(cache / "embeddings", ignore_errors=True)
        shutil.rmtree(cache / "choices", ignore_errors=True)  # the graphs' speeds not timed here yet
        runs["retr"].append(run_measured("retr", index_args(tmp / f"idx-{r}"), tmp / f"retr-{r}.log",
                                         env={"RETR_CACHE": str(cache)}))
        # the graphs' speeds as the run before stored them (once per model, graphs, CPU and versions): what any
        # later corpus on this machine meets
        shutil.rmtree(cache / "embeddings", ignore_errors=True)
        runs["retr_timed"].append(run_measured("retr", index_args(tmp / f"idx-timed-{r}"),
                                               tmp / f"retr-timed-{r}.log", env={"RETR_CACHE": str(cache)}))
        runs["st"].append(run_measured(str(Path(__file__).with_name("st_index.py")),
                                       [str(corpus), str(tmp / f"st-{r}.faiss")], tmp / f"st-{r}.log"))
        if fresh:  # on an empty cache, as on a fresh machine: the model's graphs made and checked in the run
            runs["fresh"].append(run_measured("retr", index_args(tmp / f"idx-fresh-{r}"), tmp / f"fresh-{r}.log",
                                              env={"RETR_CACHE": str(tmp / f"fresh-index-cache-{r}")}))
            # a user's next corpus: the cache as that first run left it (graphs made, the speeds it measured
            # stored), its embeddings gone, so the same corpus is encoded again as a new one would be
            shutil.rmtree(tmp / f"fresh-index-cache-{r}" / "embeddings", ignore_errors=True)
            runs["second"].append(run_measured("retr", index_args(tmp / f"idx-second-{r}"), tmp / f"second-{r}.log",
                                               env={"RETR_CACHE": str(tmp / f"fresh-index-cache-{r}")}))
    manifest = json.loads((tmp / "idx-0" / "manifest.json").read_text())
    med = {k: {m: float(np.median([x[m] for x in v])) for m in ("seconds", "peak_rss_mb")} for k, v in runs.items()}
    res = {"docs": len(corpus.read_text().splitlines()), "repeats": repeats, "backend": backend, "graphs": graphs,
           "runs": runs,
           "median": med, "speedup": med["st"]["seconds"] / med["retr"]["seconds"],
           "speedup_timed": med["st"]["seconds"] / med["retr_timed"]["seconds"],
           "retr_encode_seconds": manifest["dense"]["encode"]["encode_seconds"],
           "retr_graph": manifest["dense"]["encode"]["graph"]}
    rows = [[f"retr index ({backend or 'default backends'}; graphs made, their speeds timed in the run)",
             med["retr"]["seconds"], med["retr"]["peak_rss_mb"]],
            ["retr index (graphs made, their speeds stored by the run before)", med["retr_timed"]["seconds"],
             med["retr_timed"]["peak_rss_mb"]],
            ["sentence-transformers fp32 + FAISS flat", med["st"]["seconds"], med["st"]["peak_rss_mb"]]]
    if fresh:
        res["fresh_index"] = med["fresh"]  # the median of the runs on an empty cache, each its own
        res["fresh_index_speedup"] = med["st"]["seconds"] / res["fresh_index"]["seconds"]
        rows.append(["retr index, empty cache (graphs made and checked)", res["fresh_index"]["seconds"],
                     res["fresh_index"]["peak_rss_mb"]])
        res["second_index"] = med["second"]  # each on the cache its round's empty-cache run left
        res["second_index_speedup"] = med["st"]["seconds"] / res["second_index"]["seconds"]
        rows.append(["retr index, the next corpus (the cache as that run left it)", res["second_index"]["seconds"],
                     res["second_index"]["peak_rss_mb"]])
    if fresh and first_command:
        fresh_cache = tmp / "fresh-cache"
        res["fresh_first_command"] = run_measured(
            "retr", ["eval", "--dataset", dataset, "--no-download", "--out", str(tmp / "fresh.json")],
            tmp / "fresh.log", env={"RETR_CACHE": str(fresh_cache)})
        rows.append(["retr eval --dataset (empty cache: graphs made and checked)",
                     res["fresh_first_command"]["seconds"], res["fresh_first_command"]["peak_rss_mb"]])
        res["first_command_again"] = run_measured(  # the same command next: its index cached
            "retr", ["eval", "--dataset", dataset, "--no-download", "--out", str(tmp / "again.json")],
            tmp / "again.log", env={"RETR_CACHE": str(fresh_cache)})
        rows.append(["retr eval --dataset again (the cache as it left it)",
                     res["first_command_again"]["seconds"], res["first_command_again"]["peak_rss_mb"]])
    shutil.rmtree(tmp, ignore_errors=True)
    print(table(f"7. first run on a new {res['docs']}-document corpus, whole processes, median of {repeats}",
                 ["process", "wall s", "peak RSS MB"], rows))
    print(f"   speed-up retr vs sentence-transformers: {res['speedup']:.2f}x, {res['speedup_timed']:.2f}x with the "
          f"speeds stored (documents by {res['retr_graph'].get('backend')}, {res['retr_graph'].get('precision')})")
    if fresh:
        print(f"   on an empty cache: {res['fresh_index_speedup']:.2f}x; the next corpus: "
              f"{res['second_index_speedup']:.2f}x\n")
    else:
        print()
    return res


def section_bm25(ds, n_queries: int) -> dict:
    import tempfile

    import bm25s
    import Stemmer
    from rank_bm25 import BM25Okapi

    from retr.indexes.bm25 import build_bm25
    from retr.retrieval.bm25 import BM25Config, BM25Retriever, tokenize

    texts = [d.full_text() for d in ds.corpus.docs]
    queries = list(ds.queries.values())[:n_queries]
    cfg = BM25Config()
    tokens = tokenize(texts, cfg)
    res = {}
    peer = BM25Okapi(tokens)
    sample = queries[: max(10, n_queries // 10)]  # rank_bm25 is slow: time a tenth of the queries
    t0 = time.perf_counter()
    for q in sample:
        s = peer.get_scores(tokenize([q], cfg)[0])
        np.argpartition(-s, 10)[:10]
    res["rank_bm25"] = (time.perf_counter() - t0) / len(sample) * 1000
    model = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
    model.index(tokens, show_progress=False)
    stemmer = Stemmer.Stemmer(cfg.stemmer)
    t0 = time.perf_counter()
    for q in queries:
        qt = [t for t in bm25s.tokenize(q, stopwords=cfg.stopwords, stemmer=stemmer,
                                        return_ids=False, show_progress=False)[0] if t in model.vocab_dict]
        if qt:
            model.retrieve([qt], k=10, show_progress=False, n_threads=1)
    res["bm25s"] = (time.perf_counter() - t0) / len(queries) * 1000
    with tempfile.TemporaryDirectory() as tmp:
        build_bm25(texts, Path(tmp) / "bm25", cfg)
        ours = BM25Retriever(Path(tmp) / "bm25", ds.corpus.ids)
        t0 = time.perf_counter()
        for q in queries:
            ours.search({"q": q}, 10)
        res["retr"] = (time.perf_counter() - t0) / len(queries) * 1000
    rows = [[k, v, v / res["retr"]] for k, v in res.items()]
    print(table(f"4. BM25 per query (tokenise + score + top-10), SciFact, {len(queries)} queries",
                 ["library", "ms/query", "x retr"], rows), "\n")
    return {k: {"ms_per_query": v} for k, v in res.items()}


def synthetic_blocks(base: np.ndarray, n: int, seed: int = 0, block: int = 100_000):
    """n unit vectors shaped like real embeddings, ``block`` at a time: each is a random mix of two real embeddings
    (weights 0.5-1.0 / rest) plus Gaussian noise at a third of the mean nearest-neighbour distance,
    renormalised. They keep the anisotropy and cluster structure of the real ones."""
    rng = np.random.default_rng(seed)
    nn_dist = float(np.sqrt(np.maximum(0, 2 - 2 * np.sort(base[:500] @ base.T, axis=1)[:, -2])).mean())
    for start in range(0, n, block):
        m = min(block, n - start)
        i, j = rng.integers(0, len(base), m), rng.integers(0, len(base), m)
        w = rng.uniform(0.5, 1.0, (m, 1)).astype(np.float32)
        v = w * base[i] + (1 - w) * base[j]
        v += rng.normal(0, nn_dist / 3 / np.sqrt(base.shape[1]), v.shape).astype(np.float32)
        yield (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def synthetic_vectors(base: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """``synthetic_blocks`` in one array."""
    return np.concatenate(list(synthetic_blocks(base, n, seed)))


def single_query_qps(index, xq: np.ndarray, gt: np.ndarray, repeats: int = 3) -> dict:
    """Queries one at a time (20 warm-up queries not timed): the median QPS of ``repeats`` passes (this VM's
    neighbours make single passes erratic), each pass's QPS, and recall@10 against ``gt``."""
    for i in range(min(20, len(xq))):
        index.search(xq[i:i + 1], 10)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        found = [index.search(xq[i:i + 1], 10)[1][0] for i in range(len(xq))]
        rates.append(len(xq) / (time.perf_counter() - t0))
    recall = float(np.mean([len(set(f.tolist()) & set(g.tolist())) / 10 for f, g in zip(found, gt, strict=True)]))
    return {"recall@10": recall, "qps": float(np.median(rates)), "qps_passes": [float(r) for r in rates]}


def section_ann(ds, n: int, png: Path | None, hnsw_ms: tuple[int, ...] = (32,), ef_construction: int = 200,
                kinds: tuple[str, ...] = ("hnsw", "ivfpq")) -> dict:
    import faiss

    from retr.indexes.build import corpus_embeddings
    from retr.indexes.dense import DenseIndexConfig, build_faiss, configure_search
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    enc = BiEncoder(EncoderConfig())
    base, _ = corpus_embeddings(enc, ds.corpus)
    base = np.asarray(base)
    xb = synthetic_vectors(base, n)
    xq = enc.encode_queries(list(ds.queries.values()))
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    flat = faiss.IndexFlatIP(xb.shape[1])
    flat.add(xb)
    _, gt = flat.search(xq, 10)
    faiss.omp_set_num_threads(1)  # single-query serving: one thread per query

    def measure(index, label, build_s, params, repeats: int = 3):
        timed = single_query_qps(index, xq, gt, repeats)
        nbytes = faiss.serialize_index(index).nbytes / n
        return {"index": label, "recall@10": timed["recall@10"], "qps": timed["qps"], "bytes_per_vector": nbytes,
                "build_s": build_s, **params}

    rows = [measure(flat, "flat", 0.0, {})]
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    plans = [("hnsw", DenseIndexConfig(kind="hnsw", hnsw_m=m, ef_construction=ef_construction), "efSearch",
              (16, 32, 64, 96, 128, 160, 192, 224, 256, 320)) for m in hnsw_ms if "hnsw" in kinds]
    if "ivfpq" in kinds:
        plans.append(("ivfpq", DenseIndexConfig(kind="ivfpq"), "nprobe", (4, 8, 16, 32, 64)))
    for kind, cfg, sweep_key, sweep in plans:
        t0 = time.perf_counter()
        index, params = build_faiss(xb, cfg)
        build_s = time.perf_counter() - t0
        label = f"hnsw M{cfg.hnsw_m}" if kind == "hnsw" else kind
        faiss.omp_set_num_threads(1)
        for value in sweep:
            configure_search(index, kind, {**params, sweep_key: value})
            rows.append(measure(index, label, build_s, {**params, sweep_key: value}))
        faiss.omp_set_num_threads(os.cpu_count() or 1)
        del index
    print(table(f"6. ANN over {n:,} vectors of dimension {xb.shape[1]} (made from SciFact embeddings), "
                 f"{len(xq)} real queries, 1 thread per query",
                 ["index", "param", "recall@10", "QPS", "bytes/vec", "build s"],
                 [[r["index"], r.get("efSearch", r.get("nprobe", "-")), r["recall@10"], r["qps"],
                   r["bytes_per_vector"], r["build_s"]] for r in rows]), "\n")
    if png is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for kind in dict.fromkeys(r["index"] for r in rows[1:]):
            pts = [r for r in rows if r["index"] == kind]
            ax.plot([r["recall@10"] for r in pts], [r["qps"] for r in pts], marker="o", label=kind)
        ax.scatter([rows[0]["recall@10"]], [rows[0]["qps"]], marker="x", color="k", label="flat (exact)")
        ax.set_xlabel("recall@10 vs exact search")
        ax.set_ylabel("single-query QPS (1 thread)")
        ax.set_yscale("log")
        ax.set_title(f"{n:,} x {xb.shape[1]} vectors")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(png, dpi=110)
        print(f"   curve saved to {png}\n")
    return {"n": n, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default="1,2,3,4,5,6")
    p.add_argument("--dataset", default=str(Path(__file__).resolve().parents[1].parent / "shared/datasets/scifact"))
    p.add_argument("--encode-docs", type=int, default=5183)
    p.add_argument("--quality", action="store_true", help="section 1: also nDCG@10 (needs the full corpus)")
    p.add_argument("--backends", default="openvino-int8,openvino", help="section 1: retr backends to time")
    p.add_argument("--reranker", default=None, help="section 3: cross-encoder folder (default: MiniLM + new head)")
    p.add_argument("--rerank-queries", type=int, default=30)
    p.add_argument("--rerank-lengths", default="256,128", help="section 3: cross-encoder max lengths")
    p.add_argument("--rerank-backends", default="openvino,onnx-int8", help="section 3: retr backends to time")
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--ann-n", type=int, default=1_000_000)
    p.add_argument("--ann-kinds", default="hnsw,ivfpq", help="section 6: index kinds to build")
    p.add_argument("--hnsw-m", default="32", help="section 6: comma-separated HNSW M values, one index each")
    p.add_argument("--ef-construction", type=int, default=200, help="section 6: HNSW efConstruction")
    p.add_argument("--first-docs", type=int, default=1000, help="section 7: documents in the new corpus")
    p.add_argument("--first-repeats", type=int, default=3, help="section 7: runs of each side (median)")
    p.add_argument("--fresh", action="store_true", help="section 7: also the first command on an empty cache")
    p.add_argument("--no-first-command", action="store_true",
                   help="section 7 with --fresh: skip the first command (`retr eval --dataset`) on an empty cache")
    p.add_argument("--first-backend", default=None, help="section 7: `retr index --backend` (default: retr's)")
    p.add_argument("--out", default="benchmarks/results/speed.json")
    args = p.parse_args(argv)

    import faiss
    import torch

    from retr.eval.data import load_dataset
    from retr.retrieval.artifacts import versions
    from retr.retrieval.backends.platform import this_platform

    sections = {int(s) for s in args.sections.split(",") if s}
    header = {"command": " ".join([sys.executable, *sys.argv]), "versions": versions(), "platform": platform.platform(),
              "cpu_count": os.cpu_count(), "cpu": this_platform().to_dict(),
              "load_average": os.getloadavg(),
              "torch_threads": torch.get_num_threads(),
              "faiss_threads": faiss.omp_get_max_threads(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(json.dumps(header, indent=1), "\n")
    ds = load_dataset(args.dataset, "test", download=False)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    results: dict = {"header": header}
    if 1 in sections:
        results["encoding"] = section_encoding(ds, args.encode_docs, args.quality, tuple(args.backends.split(",")))
    if 2 in sections:
        results["query_latency"] = section_query_latency(ds, args.queries)
    if 3 in sections:
        results["rerank"] = section_rerank(ds, args.reranker, args.rerank_queries,
                                           lengths=tuple(int(x) for x in args.rerank_lengths.split(",")),
                                           backends=tuple(b.strip() for b in args.rerank_backends.split(",")))
    if 4 in sections:
        results["bm25"] = section_bm25(ds, args.queries)
    if 5 in sections:
        results["end_to_end"] = section_end_to_end(args.dataset)
    if 7 in sections:
        results["first_run"] = section_first_run(args.dataset, args.first_docs, args.first_repeats, args.fresh,
                                                 args.first_backend, not args.no_first_command)
    if 6 in sections:
        results["ann"] = section_ann(ds, args.ann_n, out_path.with_suffix(".ann.png"),
                                     tuple(int(m) for m in args.hnsw_m.split(",")), args.ef_construction,
                                     tuple(k.strip() for k in args.ann_kinds.split(",")))

    write_result(out_path, results)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # a measured side in its own process: print its result as one JSON line
        print(json.dumps(globals()[f"child_{sys.argv[2]}"](*sys.argv[3:]), default=float))
        sys.exit(0)
    sys.exit(main())
