"""Timing candidates on this machine: short, bounded, alternating runs (``chooser`` and ``precision`` read them;
no platform here, so the platform's own measurement can use them), and the one store of what was measured and
decided (``read_stored``, ``store``): small JSON files under the cache, written atomically, checked on read.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from retr.retrieval.artifacts import atomic_write_text, read_small
from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

BUDGET_S = 0.8  # timing of one candidate: at most about this long (a few candidates: a few seconds in all)
MIN_ROUNDS = 3
# a graph that adds ranking noise (another precision or runtime than the reference) is taken only where it is more
# than this much faster than the fastest that adds none: within it, the timings of a shared machine move as much
# (the same two document graphs timed twice on an AMX Xeon: int8 26% slower, then 8% faster), and issue 39 asks the
# default to be within 10% of the fastest graph. On that Xeon, int8 documents 8% faster and onnx-int8 queries cost
# hybrid nDCG@10 0.0014 on SciFact, 0.0047 after reranking.
NOISE_FREE_MARGIN = 0.10


def recorded(value, positive: bool = False) -> float:
    """A measurement read back from a file retr stored (a time, a ranking noise): a finite number >= 0, > 0 where
    ``positive`` (a time that must have passed); ``ValueError`` for anything else, a boolean or a string included
    (a damaged file: its reader measures again)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise ValueError(f"{value!r} is not a finite number {'> 0' if positive else '>= 0'}")
    return float(value)


def faster_enough(exact_s: float, noisy_s: float) -> bool:
    """Whether a graph that adds ranking noise, at ``noisy_s`` seconds a unit, is worth taking over one that adds
    none at ``exact_s``: more than ``NOISE_FREE_MARGIN`` faster."""
    return exact_s > noisy_s * (1 + NOISE_FREE_MARGIN)


def time_per_unit(run: Callable[[], object], units: int, budget_s: float = BUDGET_S,
                  min_rounds: int = MIN_ROUNDS, warm_up: Callable[[], object] | None = None) -> float:
    """Median seconds per unit of ``run()`` (which does ``units`` units of work), after one warm-up call
    (``warm_up()`` in its place where given), over at least ``min_rounds`` rounds and at most about ``budget_s``
    seconds (``time_alternating`` of one run)."""
    return time_alternating([run], units, budget_s, min_rounds, warm_ups=[warm_up] if warm_up else None)[0]


def settled(times: Sequence[Sequence[float]], ratio: float) -> bool:
    """Whether two runs' rounds (``times``: each run's seconds, round by round) have each put the same run ahead by
    more than ``ratio``: more rounds would only confirm which is faster."""
    if len(times) != 2 or not times[0]:
        return False
    ratios = [a / max(b, 1e-12) for a, b in zip(*times, strict=True)]
    return all(r > ratio for r in ratios) or all(r * ratio < 1 for r in ratios)


def time_alternating(runs: Sequence[Callable[[], object]], units: int, budget_s: float = BUDGET_S,
                     min_rounds: int = MIN_ROUNDS, clear_ratio: float | None = None,
                     warm_ups: Sequence[Callable[[], object]] | None = None) -> list[float]:
    """Median seconds per unit of each of ``runs`` (each does ``units`` units of work), timed in alternation: one
    of each per round, their order reversed every other round, after one warm-up call each, over at least
    ``min_rounds`` rounds and at most about ``budget_s`` seconds for all. A shared machine's speed drifts by a
    quarter from one second to the next (the same two document graphs timed one after the other on an AMX Xeon:
    int8 26% slower, 8% faster, 22% faster); alternating puts the drift on both sides of a comparison.
    ``clear_ratio`` (two runs): stop after ``min_rounds`` once every round has put the same run ahead by more than
    this (``settled``); close runs still take the budget. ``warm_ups``: what warms each run up in its place (a
    smaller call that compiles the same thing)."""
    for warm_up in warm_ups or runs:
        warm_up()  # compilation, first allocations
    times: list[list[float]] = [[] for _ in runs]
    start = time.perf_counter()
    rounds = 0
    while rounds < min_rounds or (time.perf_counter() - start < budget_s
                                  and not (clear_ratio is not None and settled(times, clear_ratio))):
        order = range(len(runs)) if rounds % 2 == 0 else reversed(range(len(runs)))
        for i in order:
            t0 = time.perf_counter()
            runs[i]()
            times[i].append(time.perf_counter() - t0)
        rounds += 1
        if rounds >= 200:
            break
    return [statistics.median(t) / max(1, units) for t in times]


def read_stored(path: Path, parse: Callable[[Any], Any], what: str, again: str) -> Any | None:
    """``parse`` of the JSON stored at ``path`` (a plan, a choice, a measurement); None where there is none, or where
    it is damaged (not a small regular file, not JSON, refused by ``parse``): a warning ending in ``again``."""
    try:
        return parse(json.loads(read_small(path)))  # a small regular file: a FIFO or /dev/zero is never read
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RetrError) as e:
        logger.warning("stored %s %s unreadable (%s): %s", what, path, e, again)
        return None


def store(path: Path, data: dict) -> None:
    """``data`` as JSON at ``path``, written atomically; where the cache cannot be written, not stored (made again
    next time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(data, indent=2) + "\n")
    except OSError as e:
        logger.debug("%s not stored: %s", path, e)


__all__ = ["BUDGET_S", "MIN_ROUNDS", "NOISE_FREE_MARGIN", "faster_enough", "read_stored", "settled", "store",
           "time_alternating", "time_per_unit"]
