"""`retr eval`: run pipelines over a dataset's queries, one warm query at a time, and report BEIR metrics next to
per-stage latency, build cost and index size, per pipeline and per query."""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from retr.eval.data import Dataset
from retr.eval.metrics import DEFAULT_K_VALUES, MAX_CUTOFF, evaluate, headline_cutoff
from retr.eval.pseudo import check_index_reranker
from retr.eval.report import DatasetInfo, EvalReport, Percentiles, PipelineResult
from retr.eval.trec import write_trec
from retr.indexes.build import IndexConfig, cached_index
from retr.indexes.dense import DenseIndexConfig
from retr.indexes.executors import ExecutorConfig
from retr.indexes.folder import IndexFolder
from retr.indexes.manifest import IndexManifest
from retr.indexes.searcher import Searcher
from retr.retrieval import defaults
from retr.retrieval.artifacts import versions
from retr.retrieval.bm25 import BM25Config
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.passages import PassageConfig
from retr.retrieval.pipeline import Pipeline, PipelineConfig, parse_pipelines
from retr.retrieval.progress import Progress
from retr.retrieval.protocol import StageTimer
from retr.retrieval.request import MAX_K
from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig
from retr.retrieval.sparse import SparseConfig
from retr.retrieval.types import Hit, Qrels, Run

logger = logging.getLogger(__name__)

DEFAULT_PIPELINES = defaults.PIPELINES
_FILE_UNSAFE = re.compile(r"[^\w.-]")  # in a pipeline's text, what a run file's name replaces by _


@dataclass(frozen=True)
class EvalConfig:
    pipelines: tuple[Pipeline, ...] = parse_pipelines(DEFAULT_PIPELINES)  # values, or their text form (parsed once)
    k_values: tuple[int, ...] = DEFAULT_K_VALUES
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    dense: DenseIndexConfig = field(default_factory=DenseIndexConfig)
    bm25: BM25Config = field(default_factory=BM25Config)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    reranker: RerankConfig | None = None  # needed by +rerank pipelines
    passages: PassageConfig | None = None  # index passages of documents (None: documents cut at max length)
    shards: int = 1  # > 1: the index is that many shards, each query fanned out and merged
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)  # where a new index's documents are encoded
    sparse: SparseConfig | None = None  # the learned sparse part of the index (needed by splade and hybrid3)
    ignore_identical_ids: bool = False
    warmup: int = defaults.WARMUP
    use_cache: bool = True

    def __post_init__(self) -> None:
        if not self.pipelines:
            raise RetrError("no pipeline to evaluate")
        object.__setattr__(self, "pipelines", parse_pipelines(self.pipelines))
        if any(p.reranks for p in self.pipelines) and self.reranker is None:
            raise RetrError("rerank pipelines need a cross-encoder: pass --rerank DIR")
        if not self.k_values or min(self.k_values) < 1:
            raise RetrError(f"k values must be positive integers, got {self.k_values}")
        if max(self.k_values) > MAX_K:  # each query is searched to the deepest cut-off
            raise RetrError(f"k values: a search returns at most {MAX_K:,} hits, got {max(self.k_values):,} "
                            f"(scoring a run file made elsewhere, `retr eval --run`, takes up to {MAX_CUTOFF:,})")
        if self.warmup < 0:
            raise RetrError(f"warmup must be >= 0, got {self.warmup}")


def run_pipeline(retriever, queries: dict[str, str], k: int, warmup: int) -> tuple[Run, dict[str, dict[str, float]]]:
    """One query at a time (the latency a user sees); the first ``warmup`` calls are not timed. Returns the run
    and, per query, the seconds of each stage and in total."""
    qids = list(queries)
    for qid in qids[:warmup]:
        retriever.search({qid: queries[qid]}, k)
    rankings: dict[str, tuple[Hit, ...]] = {}
    timings: dict[str, dict[str, float]] = {}
    with Progress(len(qids), f"searching ({retriever.name})", unit="q") as bar:
        for qid in qids:
            timer = StageTimer()
            t0 = time.perf_counter()
            run = retriever.search({qid: queries[qid]}, k, timer)
            total = time.perf_counter() - t0
            rankings[qid] = run[qid]
            timings[qid] = {**timer.seconds, "total": total}
            bar.update(1)
    return Run(rankings), timings


def _cost(index: IndexFolder, pipeline: Pipeline) -> dict[str, float]:
    m = index.manifest
    needs = pipeline.needs
    parts = [m.dense] * ("dense" in needs) + [m.bm25] * ("bm25" in needs) + [m.sparse] * ("sparse" in needs)
    seconds = sum(p.build_seconds for p in parts)
    return {"build_seconds": seconds, "index_bytes": sum(p.bytes for p in parts),
            "docs_per_second": m.num_docs / seconds if seconds > 0 else float("inf")}


def environment(encoder: BiEncoder | None = None, index_manifest: IndexManifest | None = None) -> dict:
    """Versions, threads and how texts were encoded (the corpus graph as recorded in the index)."""
    encode = index_manifest.dense.encode if index_manifest is not None else {}
    env = {"versions": versions(), "platform": platform.platform(), "cpu_count": os.cpu_count(), "argv": sys.argv,
           "encoder_backend": encoder.backend if encoder else None,
           "corpus_encoder": encode.get("graph") if encoder else None,
           "query_encoder": encoder.describe_queries() if encoder else None,
           "prompts": encoder.prompts.to_dict() if encoder else None}
    if "torch" in sys.modules:  # report torch's threads only where torch was used
        env["torch_threads"] = sys.modules["torch"].get_num_threads()
    if "faiss" in sys.modules:
        env["faiss_threads"] = sys.modules["faiss"].omp_get_max_threads()
    return env


def _as_json(obj):
    """``obj`` as it reads back from JSON (tuples as lists): the report equals its own round trip."""
    return json.loads(json.dumps(obj, default=str))


def _reranker(cfg: EvalConfig, queries: int) -> CrossEncoderReranker | None:
    """The cross-encoder of the rerank pipelines (None: none reranks), told how many queries they will rerank:
    where those would repay it, its static int8 graph is made first (``CrossEncoderReranker.expect``)."""
    reranking = sum(p.reranks for p in cfg.pipelines)
    if not reranking:
        return None
    reranker = CrossEncoderReranker(cfg.reranker)
    reranker.expect(queries * reranking)
    return reranker


def _reranker_record(reranker: CrossEncoderReranker, searcher: Searcher) -> dict:
    """The reranker as the report records it: what it is, where it was trained, and the weight it got here."""
    weight = searcher.parts.rerank_weight(reranker)
    return {**reranker.describe(), "trained_on_this_corpus": reranker.trained_on(searcher.parts.corpus_sha256),
            "weight": weight.weight, "weight_source": weight.source,
            "corpus_check": asdict(weight.check) if weight.check else None}


def pipeline_result(name: str, run: Run, qrels: Qrels, k_values: Sequence[int], ignore_identical_ids: bool,
                    source: str, timings: dict[str, dict[str, float]] | None = None, stages: Sequence[str] = (),
                    wall: float = 0.0, run_file: str | None = None, cost: dict[str, float] | None = None
                    ) -> PipelineResult:
    """One pipeline's part of a report: ``run`` scored against ``qrels`` (the one scorer of ``retr eval`` and
    ``retr compare``), its latency per stage from ``timings`` (seconds per query; none for a run made elsewhere),
    and its run written to ``run_file``."""
    result = evaluate(run, qrels, k_values, ignore_identical_ids)
    if result.num_queries == 0:
        raise RetrError(f"{source}: no query could be scored: the run and the qrels share no query id")
    timings = timings or {}
    per_query_ms = {q: {s: v * 1000.0 for s, v in t.items()} for q, t in timings.items()}
    if run_file is not None:
        write_trec(run, run_file, tag=f"retr-{name}")
    cost = cost or {"build_seconds": float("nan"), "index_bytes": 0, "docs_per_second": float("nan")}
    cut = headline_cutoff(k_values)
    logger.info("%s: nDCG@%d %.4f", name, cut, result.mean.get(f"NDCG@{cut}", float("nan")))
    return PipelineResult(
        name=name, metrics=result.mean, per_query=result.per_query,
        latency_ms={s: Percentiles.of([t.get(s, 0.0) for t in per_query_ms.values()]) for s in stages},
        per_query_latency_ms=per_query_ms, num_queries_scored=result.num_queries,
        qps=len(timings) / sum(t["total"] for t in timings.values()) if timings else float("nan"),
        wall_seconds=wall, run_file=run_file, **cost)


def score_runs(runs: Mapping[str, str | Path], qrels_path: str | Path, k_values: Sequence[int] = DEFAULT_K_VALUES,
               ignore_identical_ids: bool = False) -> EvalReport:
    """The report of runs made elsewhere (TREC, MS MARCO or JSONL files; name -> path) against a qrels file:
    metrics and per-query values as ``run_eval`` gives them, with the same scorer (a judged query the run lacks counts
    0, as trec_eval -c counts it); no latency (none was measured)."""
    from retr.eval.data import load_qrels
    from retr.eval.trec import read_run, say_depth, with_judged_queries

    t_start = time.perf_counter()
    qrels_path = Path(qrels_path)
    qrels = load_qrels(qrels_path)
    if not any(qrels.num_relevant(q) for q in qrels):
        raise RetrError(f"{qrels_path}: nothing to score: no judged query has a relevant document")
    read = {name: read_run(path) for name, path in runs.items()}
    for name, path in runs.items():
        say_depth(read[name], k_values, str(path))
    results = {name: pipeline_result(name, with_judged_queries(read[name], qrels, str(path)), qrels, k_values,
                                     ignore_identical_ids, str(path), stages=("total",)) for name, path in runs.items()}
    return EvalReport(
        dataset=DatasetInfo(name=qrels_path.stem, path=str(qrels_path), split="", num_docs=0,
                            num_queries=len(qrels), qrels_sha256=qrels.digest()),
        k_values=sorted(set(k_values)), ignore_identical_ids=ignore_identical_ids, pipelines=results, index={},
        reranker=None, config={"runs": {n: str(p) for n, p in runs.items()}, "qrels": str(qrels_path)},
        environment=environment(), total_seconds=time.perf_counter() - t_start)


def _searcher(index, cfg: EvalConfig, queries: int, encoder: BiEncoder | None = None,
              corpus=None) -> tuple[Searcher, CrossEncoderReranker | None]:
    """The searcher `retr search` would open on ``index`` with ``cfg``'s options, and the cross-encoder of the
    rerank pipelines, checked on this corpus as search and serve read it (the check beside the index, else the
    cache's, else measured once here: one explicit step)."""
    reranker = _reranker(cfg, queries)
    searcher = Searcher(index, cfg.encoder, cfg.pipeline, cfg.reranker, query_encoder=encoder,
                        rerankers={cfg.reranker.model: reranker} if reranker is not None else None)
    if reranker is not None and searcher.check_applies(reranker):
        check_index_reranker(index, searcher.encoder, reranker, cfg.pipeline, corpus)
    return searcher, reranker


def _pipelines(searcher: Searcher, queries: dict[str, str], qrels: Qrels, cfg: EvalConfig, run_dir: Path | None,
               run_prefix: str, source: str) -> dict[str, PipelineResult]:
    """Each pipeline of ``cfg`` over ``queries``, one warm query at a time, scored against ``qrels``: each the
    retriever ``searcher`` builds for it, the one a search with that pipeline runs."""
    k = max(cfg.k_values)
    results: dict[str, PipelineResult] = {}
    for pipeline in cfg.pipelines:
        retriever = searcher.retriever(pipeline, rerank=cfg.reranker.model if pipeline.reranks else None)
        t0 = time.perf_counter()
        run, timings = run_pipeline(retriever, queries, k, cfg.warmup)
        wall = time.perf_counter() - t0
        name = str(pipeline)
        run_file = None
        if run_dir is not None:
            run_file = str(Path(run_dir) / f"{run_prefix}.{_FILE_UNSAFE.sub('_', name)}.trec")
        results[name] = pipeline_result(name, run, qrels, cfg.k_values, cfg.ignore_identical_ids, source, timings,
                                        (*retriever.stages, "total"), wall, run_file, _cost(searcher.index, pipeline))
    return results


def run_eval_index(folder: str | Path, topics: Mapping[str, str], qrels: Qrels, cfg: EvalConfig,
                   run_dir: Path | None = None, qrels_source: str = "qrels") -> EvalReport:
    """The report of ``run_eval`` for an index folder as it is (built by `retr index`, changed by add/delete,
    sharded, of passages, lean, copied from elsewhere), searched with ``topics`` and scored against ``qrels``.
    Nothing is rebuilt or re-encoded: the documents are the index's; the query encoder is the one that built it
    (unless ``cfg.encoder.model`` names another, checked against it). Judgements of documents the index does not
    hold and of queries ``topics`` lacks are dropped, and counted, as ``--dataset`` drops them."""
    from retr.eval.data import checked_split
    from retr.indexes.shards import open_index

    t_start = time.perf_counter()
    index = open_index(folder)
    searcher = None
    try:
        qrels, check = checked_split(qrels, topics, set(index.ids), qrels_source)
        queries = {q: topics[q] for q in qrels}
        searcher, reranker = _searcher(index, cfg, len(queries))
        name = Path(index.folder).name
        split = Path(qrels_source).stem
        results = _pipelines(searcher, queries, qrels, cfg, run_dir, f"{name}.{split}", qrels_source)
        return EvalReport(
            dataset=DatasetInfo(name=name, path=str(index.folder), split=split, num_docs=len(index.ids),
                                num_queries=len(queries), qrels_check=asdict(check), qrels_sha256=qrels.digest()),
            k_values=list(cfg.k_values), ignore_identical_ids=cfg.ignore_identical_ids, pipelines=results,
            index={"folder": str(index.folder), "manifest": index.manifest.to_dict()},
            reranker=_reranker_record(reranker, searcher) if reranker else None, config=_as_json(asdict(cfg)),
            environment=environment(searcher.parts.loaded_encoder, index.manifest),
            total_seconds=time.perf_counter() - t_start)
    finally:
        (searcher or index).close()


def run_eval(dataset: Dataset, cfg: EvalConfig, run_dir: Path | None = None) -> EvalReport:
    t_start = time.perf_counter()
    needs_dense = any("dense" in p.needs for p in cfg.pipelines)
    if any("sparse" in p.needs for p in cfg.pipelines) and cfg.sparse is None:
        raise RetrError("the splade and hybrid3 pipelines need a sparse encoder: pass --sparse-model MODEL")
    encoder = BiEncoder(cfg.encoder)
    index = cached_index(dataset.name, dataset.corpus, encoder,
                         IndexConfig(dense=cfg.dense, encoder=cfg.encoder, bm25=cfg.bm25, use_cache=cfg.use_cache,
                                     passages=cfg.passages, shards=cfg.shards, executor=cfg.executor,
                                     sparse=cfg.sparse))
    searcher, reranker = _searcher(index, cfg, len(dataset.queries), encoder if needs_dense else None,
                                   dataset.corpus)
    try:
        results = _pipelines(searcher, dataset.queries, dataset.qrels, cfg, run_dir,
                             f"{dataset.name}.{dataset.split}", f"{dataset.path} ({dataset.split})")
        return EvalReport(
            dataset=DatasetInfo(name=dataset.name, path=str(dataset.path), split=dataset.split,
                                num_docs=len(dataset.corpus), num_queries=len(dataset.queries),
                                empty_docs=dataset.corpus.empty_docs, qrels_check=asdict(dataset.check),
                                qrels_sha256=dataset.qrels.digest()),
            k_values=list(cfg.k_values), ignore_identical_ids=cfg.ignore_identical_ids, pipelines=results,
            index={"folder": str(index.folder), "manifest": index.manifest.to_dict()},
            reranker=_reranker_record(reranker, searcher) if reranker else None, config=_as_json(asdict(cfg)),
            environment=environment(encoder if needs_dense else None, index.manifest),
            total_seconds=time.perf_counter() - t_start)
    finally:
        searcher.close()
