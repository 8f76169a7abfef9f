"""Which graph does which work, measured on this machine instead of assumed from its CPU flags.

For a model, each candidate graph (a backend whose graph this machine can run and already has, or can make
cheaply) is timed in a short, bounded run on retr's fixed sample: one query alone (queries), a batch of passages
(documents), one query's pairs at the rerank depth (cross-encoders). The fastest candidate that passed its
checks (agreement with torch, ranking noise: a graph that fails them is refused before it is ever timed) is
chosen. Flags only prune what cannot run here (``prune``). The choice is stored per (model hash, the candidates'
graph identities, CPU model string, library versions), so a later run reads it instead of timing again.

Static int8 document graphs cost a calibration before they can be timed; ``cost.calibration_pays`` decides whether
a corpus is large enough for the measured (or, until measured, assumed) saving to exceed that cost.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from retr.retrieval.artifacts import cache_home, versions
from retr.retrieval.backends.platform import Platform
from retr.retrieval.backends.registry import CE_MAX_RANK_NOISE, MAX_RANK_NOISE
from retr.retrieval.backends.timing import (
    NOISE_FREE_MARGIN,
    faster_enough,
    read_stored,
    recorded,
    store,
    time_alternating,
    time_per_unit,
)

logger = logging.getLogger(__name__)

QUERIES, DOCUMENTS, PAIRS = "queries", "documents", "pairs"  # the roles a graph is chosen for
# the ranking noise a graph chosen for each role may add (the bar ``checked`` held it to)
NOISE_BARS = {QUERIES: MAX_RANK_NOISE, DOCUMENTS: MAX_RANK_NOISE, PAIRS: CE_MAX_RANK_NOISE}
UNITS = {QUERIES: "ms per query", DOCUMENTS: "ms per document", PAIRS: "ms per query's pairs"}
RUNTIME_MODULES = {"openvino": "openvino", "onnxruntime": "onnxruntime"}


@dataclass(frozen=True)
class Timing:
    """One candidate as measured: seconds per unit of its role's work (None: not timed, ``why`` says why)."""
    backend: str
    seconds: float | None
    passed: bool = True  # passed its agreement and ranking-noise checks
    why: str = ""
    rank_noise: float | None = None  # ranking noise it adds against the base graph, where measured
    estimated: bool = False  # ``seconds`` estimated (from the model's size and this CPU's probe), not timed

    @property
    def ms(self) -> float | None:
        return None if self.seconds is None else self.seconds * 1000


@dataclass(frozen=True)
class Choice:
    """What does one role's work on this machine, and why."""
    role: str
    backend: str
    why: str
    timings: tuple[Timing, ...] = ()
    pruned: tuple[tuple[str, str], ...] = ()  # (backend, why it cannot run here)
    measured: bool = True  # False: read from the store, or nothing to time

    def to_dict(self) -> dict:
        return {"role": self.role, "backend": self.backend, "why": self.why, "unit": UNITS[self.role],
                "candidates": [{"backend": t.backend, "ms": t.ms, "passed": t.passed,
                                **({"rank_noise": t.rank_noise} if t.rank_noise is not None else {}),
                                **({"estimated": True} if t.estimated else {}),
                                **({"why": t.why} if t.why else {})} for t in self.timings],
                "pruned": [{"backend": b, "why": w} for b, w in self.pruned]}

    @classmethod
    def from_dict(cls, d: dict) -> Choice:
        """A stored choice; ``ValueError`` / ``TypeError`` where a field is not what ``to_dict`` writes (a damaged
        file: a verdict that is not a boolean, a time or a noise that is not a finite number >= 0)."""
        timings = tuple(Timing(str(c["backend"]), None if c.get("ms") is None else recorded(c["ms"]) / 1000,
                               _flag(c.get("passed", True)), str(c.get("why", "")),
                               None if c.get("rank_noise") is None else recorded(c["rank_noise"]),
                               _flag(c.get("estimated", False)))
                        for c in d.get("candidates", ()))
        pruned = tuple((p["backend"], p["why"]) for p in d.get("pruned", ()))
        return cls(str(d["role"]), str(d["backend"]), str(d["why"]), timings, pruned, measured=False)


def _flag(value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{value!r} is not true or false")
    return value


def prune(platform: Platform, backends: Sequence) -> tuple[list, list[tuple[str, str]]]:
    """The backends (registry values) that can run on ``platform``, and why each other one cannot: its runtime is
    not installed, or it is an int8 graph on a CPU without int8 dot-product instructions (its MatMuls would be
    emulated: static int8 measured 0.85x the base graph on an AVX2 EPYC, and it costs a calibration to learn)."""
    kept, pruned = [], []
    for b in backends:
        module = RUNTIME_MODULES.get(b.runtime)
        if module is not None and importlib.util.find_spec(module) is None:
            pruned.append((b.name, f"{module} is not installed"))
        elif b.int8 and not platform.static_int8:
            pruned.append((b.name, "no int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI, AMX) on this CPU"))
        else:
            kept.append(b)
    return kept, pruned


def checked(backend: str, seconds: float, noise: float | None, bound: float) -> Timing:
    """A timed candidate with its ranking noise against the reference graph (None: it is that graph, or computes
    as it does: nothing to check): failed where the noise is over ``bound``."""
    if noise is None:
        return Timing(backend, seconds)
    if noise > bound:
        return Timing(backend, seconds, passed=False, rank_noise=noise, why=f"ranking noise {noise:.4f} > {bound}")
    return Timing(backend, seconds, rank_noise=noise)


def choose(role: str, timings: Sequence[Timing], fallback: str, pruned: Sequence[tuple[str, str]] = ()) -> Choice:
    """The fastest timed candidate that passed its checks; ``fallback`` (with the reason) when none did. A candidate
    that adds more ranking noise than another is taken only where it is more than ``NOISE_FREE_MARGIN`` faster
    (``faster_enough``): within it, the one that adds the least (none, where it computes as the reference does),
    the faster of equals. Ties go to the earlier candidate (the configured backend comes first)."""
    ok = [t for t in timings if t.passed and t.seconds is not None]
    if not ok:
        return Choice(role, fallback, "no candidate was timed and passed: the configured graph", tuple(timings),
                      tuple(pruned))
    best = min(ok, key=lambda t: t.seconds)
    calmer = [t for t in ok if _noise(t) < _noise(best) and not faster_enough(t.seconds, best.seconds)]
    if calmer:
        pick = min(calmer, key=lambda t: (_noise(t), t.seconds))
        why = f"{pick.ms:.2f} {UNITS[role]}, within {NOISE_FREE_MARGIN:.0%} of the fastest ({best.backend}, {best.ms:.2f}), "
        why += "and adds no ranking noise" if pick.rank_noise is None else \
            f"and adds less ranking noise ({pick.rank_noise:.4f} against {best.rank_noise:.4f})"
        return Choice(role, pick.backend, why, tuple(timings), tuple(pruned))
    others = [t for t in ok if t is not best]
    why = f"fastest of {len(ok)} passing candidate(s): {best.ms:.2f} {UNITS[role]}"
    if others:
        runner_up = min(others, key=lambda t: t.seconds)
        why += f" against {runner_up.ms:.2f} for {runner_up.backend}"
    failed = [t.backend for t in timings if not t.passed]
    if failed:
        why += f"; failed their checks: {', '.join(failed)}"
    return Choice(role, best.backend, why, tuple(timings), tuple(pruned))


def decide(role: str, key: str, candidates: Mapping[str, object], timing: Callable[[str, object], Timing],
           fallback: str, *, model_hash: str, platform: Platform, label: str | None = None,
           again: bool = False) -> Choice:
    """The one chooser of every role: the choice stored under ``key`` (``choice_key``) where it still names one of
    ``candidates``; else every candidate timed and checked (``timing(name, candidate)``), the fastest that passed
    taken (``choose``; ``fallback`` where none did), said in an info line and stored for the next run. ``again``:
    timed whatever is stored (`retr doctor`)."""
    store = ChoiceStore(cache_home())
    stored = None if again else store.get(key, among=candidates)
    if stored is not None:
        return stored
    choice = choose(role, [timing(name, c) for name, c in candidates.items()], fallback)
    logger.info("%s: %s (%s)", label or role, choice.backend, choice.why)
    store.put(key, choice, model_hash=model_hash, cpu=platform.cpu)
    return choice


def _noise(t: Timing) -> float:
    """The ranking noise a timed candidate adds (none where it computes as the reference does)."""
    return t.rank_noise or 0.0


# -- the store -------------------------------------------------------------------------------------------------

def choice_key(model_hash: str, role: str, graph_ids: Sequence[str], platform: Platform) -> str:
    """What a stored choice is valid for: the model, the role, every candidate's graph identity, the CPU model
    string and the library versions. Any of them changes: time again."""
    # the rule a choice was made by is part of it: choices made with another margin are made again
    raw = json.dumps([model_hash, role, sorted(graph_ids), platform.cpu, platform.precision, versions(),
                      f"noise_free_margin={NOISE_FREE_MARGIN}"], sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class ChoiceStore:
    """Choices kept under ``<cache>/choices/<key>.json`` (JSON, written atomically)."""
    root: Path

    def _path(self, key: str) -> Path:
        return self.root / "choices" / f"{key}.json"

    def get(self, key: str, among=None) -> Choice | None:
        """The choice stored under ``key``; None where there is none, it is unreadable, it names a candidate its
        own timings record as failing its check (a damaged file: timed again), or (``among``: the candidates there
        are now) it chose a candidate no longer among them."""
        choice = read_stored(self._path(key), Choice.from_dict, "choice", "timed again")
        if choice is None:
            return None
        if any(t.backend == choice.backend and not t.passed for t in choice.timings):
            logger.warning("stored choice %s names %s, which failed its check there: timed again",
                           self._path(key), choice.backend)
            return None
        bar = NOISE_BARS.get(choice.role)  # its figures checked against the bar, not its verdict alone
        noisy = [t.rank_noise for t in choice.timings if t.backend == choice.backend and t.rank_noise is not None
                 and bar is not None and t.rank_noise > bar]
        if noisy:
            logger.warning("stored choice %s names %s with ranking noise %.4f, over the bar of %s: timed again",
                           self._path(key), choice.backend, noisy[0], bar)
            return None
        return choice if among is None or choice.backend in among else None

    def put(self, key: str, choice: Choice, **info) -> None:
        store(self._path(key), {**choice.to_dict(), **info})


__all__ = ["DOCUMENTS", "NOISE_FREE_MARGIN", "PAIRS", "QUERIES", "Choice", "ChoiceStore", "Timing",
           "checked", "choice_key", "choose", "decide", "faster_enough", "prune", "time_alternating",
           "time_per_unit"]
