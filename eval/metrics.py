"""BEIR metrics as small pure functions with trec_eval / pytrec_eval semantics.

Per query, a ranking is judged in trec_eval order (score descending, ties broken by doc id
descending). Grades > 0 are relevant; nDCG uses the grades as gains. A query is scored when it
appears both in the run (even with no hits) and in the qrels, exactly as pytrec_eval does, and the
mean is taken over those queries, as BEIR's ``EvaluateRetrieval.evaluate`` does. Nothing is rounded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from retr.retrieval import defaults
from retr.retrieval.types import Qrels, Run

DEFAULT_K_VALUES: tuple[int, ...] = defaults.K_VALUES
MRR_CUTOFF = 10
MAX_CUTOFF = 1_000_000  # the deepest cut-off scored (`--k-values`, ``retr.evaluate``'s ``k_values``)


def headline_cutoff(k_values: Sequence[int]) -> int:
    """The cut-off a report's headline nDCG, MAP and P are read at: 10 where it was scored, else the deepest."""
    return 10 if 10 in k_values else max(k_values)


def ndcg_at_k(ranked: Sequence[str], grades: Mapping[str, int], k: int) -> float:
    dcg = sum(max(grades.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal_gains = sorted((g for g in grades.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal_gains))
    return dcg / idcg if idcg > 0 else 0.0


def average_precision_at_k(ranked: Sequence[str], grades: Mapping[str, int], k: int) -> float:
    num_rel = sum(1 for g in grades.values() if g > 0)
    if num_rel == 0:
        return 0.0
    hits, total = 0, 0.0
    for i, d in enumerate(ranked[:k]):
        if grades.get(d, 0) > 0:
            hits += 1
            total += hits / (i + 1)
    return total / num_rel


def recall_at_k(ranked: Sequence[str], grades: Mapping[str, int], k: int) -> float:
    num_rel = sum(1 for g in grades.values() if g > 0)
    if num_rel == 0:
        return 0.0
    return sum(1 for d in ranked[:k] if grades.get(d, 0) > 0) / num_rel


def precision_at_k(ranked: Sequence[str], grades: Mapping[str, int], k: int) -> float:
    return sum(1 for d in ranked[:k] if grades.get(d, 0) > 0) / k


def reciprocal_rank_at_k(ranked: Sequence[str], grades: Mapping[str, int], k: int) -> float:
    for i, d in enumerate(ranked[:k]):
        if grades.get(d, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def _query_metrics(ranked: Sequence[str], grades: Mapping[str, int], k_values: Sequence[int]) -> dict[str, float]:
    """All metrics of one query in one pass over its ranking (same definitions as the functions above)."""
    top = ranked[: max(max(k_values), MRR_CUTOFF)]
    gains = [max(grades.get(d, 0), 0) for d in top]
    num_rel = sum(1 for g in grades.values() if g > 0)
    ideal = sorted((g for g in grades.values() if g > 0), reverse=True)
    first_rel = next((i for i, g in enumerate(gains) if g > 0), None)
    out: dict[str, float] = {}
    dcg = idcg = ap_sum = 0.0
    hits = 0
    i = 0
    seen = max(len(gains), len(ideal))  # past both, no cut-off adds gain or ideal gain
    for k in k_values:
        while i < min(k, seen):
            if i < len(gains):
                g = gains[i]
                if g > 0:
                    dcg += g / math.log2(i + 2)
                    hits += 1
                    ap_sum += hits / (i + 1)
            if i < len(ideal):
                idcg += ideal[i] / math.log2(i + 2)
            i += 1
        out[f"NDCG@{k}"] = dcg / idcg if idcg > 0 else 0.0
        out[f"MAP@{k}"] = ap_sum / num_rel if num_rel else 0.0
        out[f"Recall@{k}"] = hits / num_rel if num_rel else 0.0
        out[f"P@{k}"] = hits / k
    out[f"MRR@{MRR_CUTOFF}"] = 1.0 / (first_rel + 1) if first_rel is not None and first_rel < MRR_CUTOFF else 0.0
    return out


@dataclass(frozen=True)
class Evaluation:
    """Mean metrics plus the per-query values they were averaged from (unrounded)."""

    mean: dict[str, float]
    per_query: dict[str, dict[str, float]]
    num_queries: int


def metric_names(k_values: Sequence[int]) -> list[str]:
    names = [f"{m}@{k}" for m in ("NDCG", "MAP", "Recall", "P") for k in k_values]
    return names + [f"MRR@{MRR_CUTOFF}"]


def evaluate(run: Run, qrels: Qrels, k_values: Sequence[int] = DEFAULT_K_VALUES,
             ignore_identical_ids: bool = False) -> Evaluation:
    """Score ``run`` against ``qrels``. Neither input is modified (both are immutable)."""
    k_values = sorted({int(k) for k in k_values})
    if not k_values or k_values[0] < 1:
        raise ValueError(f"k values must be positive integers, got {k_values}")
    if ignore_identical_ids:
        run = run.without_identical_ids()
    per_query: dict[str, dict[str, float]] = {}
    for qid in run:
        if qid not in qrels:
            continue
        per_query[qid] = _query_metrics([h.doc_id for h in run[qid]], qrels[qid], k_values)
    names = metric_names(k_values)
    n = len(per_query)
    mean = {m: (sum(s[m] for s in per_query.values()) / n if n else 0.0) for m in names}
    return Evaluation(mean=mean, per_query=per_query, num_queries=n)
