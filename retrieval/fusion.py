"""Rank fusion (pure functions over ``Run`` s) and the hybrid retriever that composes two."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from retr.retrieval.errors import RetrError
from retr.retrieval.protocol import Retriever, StageTimer
from retr.retrieval.types import Hit, Run, trec_sorted

FUSIONS = ("rrf", "minmax")


def _ranked(scores: dict[str, float], k: int) -> list[Hit]:
    return trec_sorted(Hit(d, s) for d, s in scores.items())[:k]


def rrf(runs: Sequence[Run], k: int, rrf_k: int = 60) -> Run:
    """Reciprocal rank fusion: score(d) = sum over runs of 1 / (rrf_k + rank(d)), ranks from 1."""
    qids = list(dict.fromkeys(q for run in runs for q in run))
    out = {}
    for q in qids:
        scores: dict[str, float] = {}
        for run in runs:
            for rank, h in enumerate(run.get(q, ()), start=1):
                scores[h.doc_id] = scores.get(h.doc_id, 0.0) + 1.0 / (rrf_k + rank)
        out[q] = _ranked(scores, k)
    return Run(out)


def minmax(runs: Sequence[Run], k: int, weights: Sequence[float] | None = None) -> Run:
    """Weighted sum of per-query min-max normalised scores (a document a run missed gets 0)."""
    weights = list(weights) if weights is not None else [1.0 / len(runs)] * len(runs)
    if len(weights) != len(runs):
        raise RetrError(f"{len(weights)} fusion weights for {len(runs)} runs")
    qids = list(dict.fromkeys(q for run in runs for q in run))
    out = {}
    for q in qids:
        scores: dict[str, float] = {}
        for run, w in zip(runs, weights, strict=True):
            hits = run.get(q, ())
            if not hits:
                continue
            lo, hi = min(h.score for h in hits), max(h.score for h in hits)
            span = hi - lo
            for h in hits:
                norm = (h.score - lo) / span if span > 0 else 1.0
                scores[h.doc_id] = scores.get(h.doc_id, 0.0) + w * norm
        out[q] = _ranked(scores, k)
    return Run(out)


def zscore(runs: Sequence[Run], k: int, weights: Sequence[float] | None = None) -> Run:
    """Weighted sum of per-query standardised scores ((s - mean) / std over the run's list for that query; a
    document a run missed gets that run's lowest standardised score)."""
    weights = list(weights) if weights is not None else [1.0 / len(runs)] * len(runs)
    if len(weights) != len(runs):
        raise RetrError(f"{len(weights)} fusion weights for {len(runs)} runs")
    qids = list(dict.fromkeys(q for run in runs for q in run))
    out = {}
    for q in qids:
        parts = []
        for run, w in zip(runs, weights, strict=True):
            hits = run.get(q, ())
            if not hits:
                continue
            s = [h.score for h in hits]
            mean = sum(s) / len(s)
            std = (sum((x - mean) ** 2 for x in s) / len(s)) ** 0.5 or 1.0
            parts.append((w, {h.doc_id: (h.score - mean) / std for h in hits}, (min(s) - mean) / std))
        docs = dict.fromkeys(d for _, z, _ in parts for d in z)
        scores = {d: sum(w * z.get(d, floor) for w, z, floor in parts) for d in docs}
        out[q] = _ranked(scores, k)
    return Run(out)


class HybridRetriever:
    """Runs two retrievers to ``depth`` each and fuses their rankings."""

    name = "hybrid"

    def __init__(self, first: Retriever, second: Retriever, fusion: str = "rrf", depth: int = 100,
                 rrf_k: int = 60, weights: Sequence[float] | None = None):
        if fusion not in FUSIONS:
            raise RetrError(f"unknown fusion {fusion!r}: choose one of {', '.join(FUSIONS)}")
        self.first, self.second = first, second
        self.fusion, self.depth, self.rrf_k, self.weights = fusion, depth, rrf_k, weights
        self.stages = tuple(dict.fromkeys(first.stages + second.stages + ("fusion",)))

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        timer = timer or StageTimer()
        depth = max(k, self.depth)
        a = self.first.search(queries, depth, timer)
        b = self.second.search(queries, depth, timer)
        with timer.stage("fusion"):
            if self.fusion == "rrf":
                return rrf([a, b], k, self.rrf_k)
            return minmax([a, b], k, self.weights)
