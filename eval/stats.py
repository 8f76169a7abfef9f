"""Paired significance tests, multiple-comparison correction and bootstrap intervals: small pure functions over
per-query values (checked against scipy in the tests).

Conventions follow scipy: the t-test is ``scipy.stats.ttest_rel``'s (two-sided); the randomization test is
``scipy.stats.permutation_test`` with ``permutation_type="samples"`` and the mean difference as statistic: exact
(every sign assignment) when ``2**n <= resamples``, else ``resamples`` seeded random ones; two-sided p is twice the
smaller one-sided p, with scipy's tolerance for ties.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RESAMPLES = 10_000


def _diffs(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    a_, b_ = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a_.shape != b_.shape or a_.ndim != 1:
        raise ValueError(f"paired samples must have the same length ({a_.shape} vs {b_.shape})")
    return b_ - a_


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(t, two-sided p) of the paired t-test of ``b - a``; (nan, nan) under 2 pairs; p = 1 when every difference is
    equal to zero (and t 0), as no test could tell the two apart."""
    from scipy.special import stdtr

    d = _diffs(a, b)
    n = d.size
    if n < 2:
        return float("nan"), float("nan")
    mean = d.mean()
    sd = d.std(ddof=1)
    if sd == 0:
        return (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    t = mean / (sd / math.sqrt(n))
    return float(t), float(2.0 * stdtr(n - 1, -abs(t)))


def randomization_test(a: Sequence[float], b: Sequence[float], resamples: int = RESAMPLES, seed: int = 0) -> float:
    """Two-sided p of the paired randomization (sign-flip) test of the mean of ``b - a``."""
    d = _diffs(a, b)
    n = d.size
    if n == 0:
        return float("nan")
    observed = d.mean()
    if n < 63 and 2 ** n <= resamples:  # exact: every assignment of signs
        signs = ((np.arange(2 ** n)[:, None] >> np.arange(n)[None, :]) & 1) * -2 + 1
        null = (signs * d).mean(axis=1)
        adjustment, count = 0, null.size
    else:
        rng = np.random.default_rng(seed)
        null = np.empty(resamples)
        for start in range(0, resamples, 1000):  # bounded memory: 1000 x n signs at a time
            m = min(1000, resamples - start)
            null[start:start + m] = (rng.choice((-1.0, 1.0), size=(m, n)) * d).mean(axis=1)
        adjustment, count = 1, resamples
    gamma = abs(np.finfo(np.float64).eps * 100 * observed)
    less = (np.count_nonzero(null <= observed + gamma) + adjustment) / (count + adjustment)
    greater = (np.count_nonzero(null >= observed - gamma) + adjustment) / (count + adjustment)
    return float(min(1.0, 2.0 * min(less, greater)))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order as given; nan stays nan and is not counted)."""
    idx = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    m = len(idx)
    order = sorted(idx, key=lambda i: pvalues[i])
    out = [float("nan")] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def bootstrap_ci(a: Sequence[float], b: Sequence[float], statistic=np.median, resamples: int = RESAMPLES,
                 seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """``statistic(b) - statistic(a)`` and its percentile bootstrap interval, resampling the pairs together."""
    a_, b_ = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    _diffs(a_, b_)
    observed = float(statistic(b_) - statistic(a_))
    if a_.size < 2:
        return observed, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    for start in range(0, resamples, 1000):
        m = min(1000, resamples - start)
        idx = rng.integers(0, a_.size, size=(m, a_.size))
        stats[start:start + m] = statistic(b_[idx], axis=1) - statistic(a_[idx], axis=1)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(stats, [tail, 100.0 - tail])
    return observed, float(lo), float(hi)
