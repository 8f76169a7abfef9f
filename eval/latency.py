"""Latency as a measurement: warm-up excluded, per stage, percentiles, in milliseconds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def percentiles(samples_s: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/mean in milliseconds (numpy's linear interpolation), plus the sample count."""
    if not len(samples_s):
        return {"p50": float("nan"), "p95": float("nan"), "p99": float("nan"), "mean": float("nan"), "n": 0}
    ms = np.asarray(samples_s, dtype=np.float64) * 1000.0
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "mean": float(ms.mean()), "n": int(ms.size)}


def summarize(per_query: Sequence[Mapping[str, float]], stages: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per-stage and total latency percentiles from one ``{stage: seconds, 'total': seconds}`` per query."""
    out = {stage: percentiles([q.get(stage, 0.0) for q in per_query]) for stage in stages}
    out["total"] = percentiles([q["total"] for q in per_query])
    return out
