"""Rank fusion: pure functions over ``Run`` s (any number of them); the stage that runs them is ``retr.retrieval.fuse``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from retr.retrieval import defaults
from retr.retrieval.errors import RetrError
from retr.retrieval.types import Hit, Run, trec_sorted

# the default: chosen on SciFact's dev split (20% of train, seed 42; nDCG@10 minmax 0.7565, zscore 0.7505, RRF 0.7377)
# and checked zero-shot by benchmarks/fusion_study.py (see the README's "Fusion" section)
DEFAULT_FUSION = defaults.FUSION


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


def _score_fusion(runs: Sequence[Run], k: int, weights: Sequence[float] | None, depth: int | None, normaliser) -> Run:
    """Weighted sum of per-query normalised scores. ``normaliser(head scores) -> f`` maps a score to its normalised
    value, with its statistics taken from each list's top ``depth`` (all of it when None). A document inside some
    list's head scores the sum of its values clipped below at each head's floor (a list that missed it, or holds it
    deeper, gives the floor): that head of the fused ranking is the same however deep the lists go, so a search for
    10 (lists 100 deep) and an eval for 1000 agree on it. Documents in no head follow, by their unclipped sum (a
    list that missed one gives its deepest value), so deep recall keeps both lists' order."""
    weights = list(weights) if weights is not None else [1.0 / len(runs)] * len(runs)
    if len(weights) != len(runs):
        raise RetrError(f"{len(weights)} fusion weights for {len(runs)} runs")
    qids = list(dict.fromkeys(q for run in runs for q in run))
    return Run({q: _fused(runs, q, k, weights, depth, normaliser) for q in qids})


def _fused(runs: Sequence[Run], q: str, k: int, weights: Sequence[float], depth: int | None,
           normaliser) -> list[Hit]:
    """One query's ``_score_fusion``, in arrays: each list's normalised values scattered over the documents of all
    lists, summed in the lists' order as Python's ``sum`` adds them (the same float64 operations, so the same
    scores as adding them one document at a time), ranked in trec_eval's order by one sort of the arrays, and only
    the top ``k`` made into hits."""
    parts = [(run.get(q, ()), w) for run, w in zip(runs, weights, strict=True)]
    parts = [(hits, w) for hits, w in parts if hits]
    if not parts:
        return []
    position: dict[str, int] = {}
    for hits, _ in parts:
        for h in hits:
            position.setdefault(h.doc_id, len(position))
    docs = list(position)
    in_head = np.zeros(len(docs), dtype=bool)
    columns = []
    for hits, w in parts:
        n_head = min(len(hits), depth) if depth else len(hits)
        raw = [h.score for h in hits]
        values = normaliser(raw[:n_head])(np.asarray(raw, dtype=np.float64))  # elementwise, as for one score
        at = np.fromiter((position[h.doc_id] for h in hits), dtype=np.int64, count=len(hits))
        in_head[at[:n_head]] = True
        columns.append((w, values, at, values[n_head - 1], values[-1]))
    head_sum = np.zeros(len(docs))
    rest_sum = np.zeros(len(docs))
    for w, values, at, floor, deepest in columns:
        clipped = np.full(len(docs), floor)  # a list that missed a document gives its head's floor
        clipped[at] = np.maximum(values, floor)  # max(floor, value): the value where above the floor
        head_sum = head_sum + w * clipped
        unclipped = np.full(len(docs), deepest)  # ... and below every head, its deepest value
        unclipped[at] = values
        rest_sum = rest_sum + w * unclipped
    scores = np.where(in_head, head_sum, rest_sum)
    # trec_eval's order: score descending, ties by doc id descending: the reverse of (score, id) ascending (ids
    # compared by code point, as Python compares them; every (score, id) is distinct, so the order is unique)
    order = np.lexsort((np.asarray(docs), scores))[::-1][:k].tolist()
    return [Hit(docs[i], float(scores[i])) for i in order]


def _minmax_of(head: list[float]):
    """The min-max map of a head's scores, for one score or an array of them (elementwise, the same floats)."""
    lo, hi = min(head), max(head)
    span = hi - lo
    return (lambda s: (s - lo) / span) if span > 0 else (lambda s: np.where(np.asarray(s) >= hi, 1.0, s - lo))


def _zscore_of(head: list[float]):
    """The standardising map of a head's scores, for one score or an array of them."""
    mean = sum(head) / len(head)
    std = (sum((x - mean) ** 2 for x in head) / len(head)) ** 0.5 or 1.0
    return lambda s: (s - mean) / std


def minmax(runs: Sequence[Run], k: int, weights: Sequence[float] | None = None, depth: int | None = None) -> Run:
    """Weighted sum of per-query min-max normalised scores (min and max of each list's top ``depth``; a document
    a list missed gets 0, its floor). See ``_score_fusion`` for how documents below every head are ordered."""
    return _score_fusion(runs, k, weights, depth, _minmax_of)


def zscore(runs: Sequence[Run], k: int, weights: Sequence[float] | None = None, depth: int | None = None) -> Run:
    """Weighted sum of per-query standardised scores ((s - mean) / std over each list's top ``depth``; a document
    a list missed gets that head's lowest value)."""
    return _score_fusion(runs, k, weights, depth, _zscore_of)


def _peak(hits) -> float:
    """How far a run's top score stands out of its list for a query (its z-score; 0 when flat): a retriever that
    found something distinctive for this query has an outlying first hit."""
    s = [h.score for h in hits]
    return max(0.0, _zscore_of(s)(s[0])) if len(s) > 1 else 0.0


def adaptive(runs: Sequence[Run], k: int, method=None) -> Run:
    """Per query, each run weighted by how peaked its own scores are (``_peak``), then fused by ``method``
    (``zscore`` by default) with those weights; equal weights where no run stands out."""
    method = method or zscore
    qids = list(dict.fromkeys(q for run in runs for q in run))
    out = {}
    for q in qids:
        peaks = [_peak(run.get(q, ())) for run in runs]
        total = sum(peaks)
        weights = [p / total for p in peaks] if total > 0 else [1.0 / len(runs)] * len(runs)
        out[q] = method([Run({q: run.get(q, ())}) for run in runs], k, weights)[q]
    return Run(out)


# name -> fuse(runs, k, rrf_k, weights): the one place a fusion name is looked up
FUSIONS = {
    "minmax": lambda runs, k, rrf_k, weights, depth: minmax(runs, k, weights, depth),
    "zscore": lambda runs, k, rrf_k, weights, depth: zscore(runs, k, weights, depth),
    "rrf": lambda runs, k, rrf_k, weights, depth: rrf(runs, k, rrf_k),
}

ADAPTIVE = {"adaptive zscore": lambda runs, k: adaptive(runs, k, zscore),
            "adaptive minmax": lambda runs, k: adaptive(runs, k, minmax)}
