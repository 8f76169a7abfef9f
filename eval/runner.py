"""`retr eval`: run pipelines over a dataset's queries, one warm query at a time, and report
BEIR metrics next to per-stage latency, build cost and index size."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from retr.eval.data import Dataset
from retr.eval.latency import summarize
from retr.eval.metrics import DEFAULT_K_VALUES, evaluate
from retr.indexes.atomic import atomic_write_text
from retr.indexes.build import IndexConfig, build_index
from retr.indexes.cache import cache_home
from retr.indexes.dense import DenseIndexConfig
from retr.indexes.index import IndexFolder
from retr.indexes.manifest import versions
from retr.retrieval.bm25 import BM25Config
from retr.retrieval.encoder import DEFAULT_BACKEND, BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.pipeline import PipelineConfig, PipelineFactory
from retr.retrieval.protocol import StageTimer
from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig
from retr.retrieval.types import Hit, Run

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalConfig:
    pipelines: tuple[str, ...] = ("bm25", "dense", "hybrid")
    k_values: tuple[int, ...] = DEFAULT_K_VALUES
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    dense: DenseIndexConfig = field(default_factory=DenseIndexConfig)
    bm25: BM25Config = field(default_factory=BM25Config)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    reranker: str | None = None
    rerank_max_length: int = 256
    rerank_backend: str = DEFAULT_BACKEND
    rerank_alpha: float | None = None
    ignore_identical_ids: bool = False
    warmup: int = 5
    use_cache: bool = True


def _index_key(dataset: Dataset, encoder: BiEncoder, cfg: EvalConfig) -> str:
    raw = json.dumps([dataset.corpus.sha256, encoder.model_hash, encoder.max_length, encoder.backend, asdict(cfg.dense),
                      asdict(cfg.bm25)], sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def cached_index(dataset: Dataset, encoder: BiEncoder, cfg: EvalConfig) -> IndexFolder:
    """The dataset's index from the cache, or built into it."""
    folder = cache_home() / "indexes" / f"{dataset.name}-{_index_key(dataset, encoder, cfg)}"
    if cfg.use_cache and folder.is_dir():
        try:
            index = IndexFolder(folder)
            if index.manifest["corpus"]["sha256"] == dataset.corpus.sha256 and index.has_bm25:
                logger.info("index cache used: %s", folder)
                return index
        except RetrError as e:
            logger.warning("cached index %s unusable (%s): rebuilding", folder, e)
    index_cfg = IndexConfig(dense=cfg.dense, encoder=cfg.encoder, bm25=cfg.bm25, use_cache=cfg.use_cache)
    build_index(dataset.corpus, folder, index_cfg, encoder=encoder)
    return IndexFolder(folder)


def run_pipeline(retriever, queries: dict[str, str], k: int, warmup: int) -> tuple[Run, list[dict[str, float]]]:
    """One query at a time (the latency a user sees); the first ``warmup`` calls are not timed."""
    from tqdm.auto import tqdm

    qids = list(queries)
    for qid in qids[:warmup]:
        retriever.search({qid: queries[qid]}, k)
    rankings: dict[str, tuple[Hit, ...]] = {}
    timings: list[dict[str, float]] = []
    for qid in tqdm(qids, desc=f"{retriever.name}", unit="q", leave=False, disable=None):
        timer = StageTimer()
        t0 = time.perf_counter()
        run = retriever.search({qid: queries[qid]}, k, timer)
        total = time.perf_counter() - t0
        rankings[qid] = run[qid]
        timings.append({**timer.seconds, "total": total})
    return Run(rankings), timings


def _cost(index: IndexFolder, pipeline: str) -> dict[str, float]:
    m = index.manifest
    parts = []
    base = pipeline.split("+")[0]
    if base in ("dense", "hybrid"):
        parts.append(m["dense"])
    if base in ("bm25", "hybrid"):
        parts.append(m["bm25"])
    seconds = sum(p["build_seconds"] for p in parts)
    return {"build_seconds": seconds, "index_bytes": sum(p["bytes"] for p in parts),
            "docs_per_second": m["num_docs"] / seconds if seconds > 0 else float("inf")}


def environment(encoder: BiEncoder | None = None, index_manifest: dict | None = None) -> dict:
    """Versions, threads and how texts were encoded (the corpus graph as recorded in the index)."""
    dense = (index_manifest or {}).get("dense") or {}
    env = {"versions": versions(), "platform": platform.platform(), "cpu_count": os.cpu_count(), "argv": sys.argv,
           "encoder_backend": encoder.backend if encoder else None,
           "corpus_encoder": (dense.get("encode") or {}).get("graph") if encoder else None,
           "query_encoder": encoder.describe_queries() if encoder else None}
    if "torch" in sys.modules:  # report torch's threads only where torch was used
        env["torch_threads"] = sys.modules["torch"].get_num_threads()
    if "faiss" in sys.modules:
        env["faiss_threads"] = sys.modules["faiss"].omp_get_max_threads()
    return env


def run_eval(dataset: Dataset, cfg: EvalConfig, run_dir: Path | None = None) -> dict:
    t_start = time.perf_counter()
    needs_dense = any(p.split("+")[0] in ("dense", "hybrid") for p in cfg.pipelines)
    encoder = BiEncoder(cfg.encoder)
    index = cached_index(dataset, encoder, cfg)
    reranker = None
    if any(p.endswith("+rerank") for p in cfg.pipelines):
        if not cfg.reranker:
            raise RetrError("rerank pipelines need a cross-encoder: pass --reranker DIR")
        reranker = CrossEncoderReranker(RerankConfig(model=cfg.reranker, depth=cfg.pipeline.rerank_depth,
                                                     max_length=cfg.rerank_max_length, interpolation=cfg.rerank_alpha,
                                                     backend=cfg.rerank_backend))
    factory = PipelineFactory(index, encoder if needs_dense else None, reranker, cfg.pipeline)
    k = max(cfg.k_values)
    report: dict = {
        "dataset": {"name": dataset.name, "path": str(dataset.path), "split": dataset.split,
                    "num_docs": len(dataset.corpus), "num_queries": len(dataset.queries),
                    "empty_docs": dataset.corpus.empty_docs, "qrels_check": asdict(dataset.check)},
        "k_values": list(cfg.k_values),
        "ignore_identical_ids": cfg.ignore_identical_ids,
        "pipelines": {},
        "index": {"folder": str(index.folder), "manifest": index.manifest},
        "reranker": reranker.describe() if reranker else None,
        "config": asdict(cfg),
        "environment": environment(encoder if needs_dense else None, index.manifest),
    }
    for name in cfg.pipelines:
        retriever = factory.make(name)
        t0 = time.perf_counter()
        run, timings = run_pipeline(retriever, dataset.queries, k, cfg.warmup)
        wall = time.perf_counter() - t0
        result = evaluate(run, dataset.qrels, cfg.k_values, cfg.ignore_identical_ids)
        entry = {
            "metrics": result.mean,
            "num_queries_scored": result.num_queries,
            "latency_ms": summarize(timings, retriever.stages),
            "qps": len(timings) / sum(t["total"] for t in timings) if timings else 0.0,
            "wall_seconds": wall,
            **_cost(index, name),
        }
        if run_dir is not None:
            path = Path(run_dir) / f"{dataset.name}.{dataset.split}.{name.replace('+', '_')}.trec"
            run.write_trec(path, tag=f"retr-{name}")
            entry["run_file"] = str(path)
        report["pipelines"][name] = entry
        logger.info("%s: nDCG@10 %.4f", name, result.mean.get("NDCG@10", float("nan")))
    report["total_seconds"] = time.perf_counter() - t_start
    return report


def write_report(report: dict, path: Path) -> None:
    atomic_write_text(Path(path), json.dumps(report, indent=2, default=str) + "\n")
