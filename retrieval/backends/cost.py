"""The graph plan's cost model: pure arithmetic over priors and measured figures, nothing timed or made here.

The priors (what is assumed until measured: static int8's speed over the base graph's on each kind of CPU, what a
calibration costs, ...) are data, each with the measurement it comes from: ``priors.json`` beside this module.
``calibration_pays`` weighs a static int8 graph's saving against its calibration's cost (``Break``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from retr.retrieval.backends.timing import faster_enough

PRIORS_FILE = Path(__file__).with_name("priors.json")
BASE = "base"  # ``Break.against``: the corpus's base graph


class Platform(Protocol):
    """What the cost model reads of a ``platform.Platform`` (which reads its priors here)."""
    int8_forced: bool | None
    amx: bool
    int8_dot: bool
    bf16: bool


@functools.cache
def priors() -> dict[str, dict]:
    """Every prior as shipped (``priors.json``): name -> {value, unit, source}."""
    data = json.loads(PRIORS_FILE.read_text())
    return {name: entry for name, entry in data.items() if isinstance(entry, dict)}


def prior(name: str) -> float:
    """The value of the prior ``name`` (``priors.json``)."""
    return priors()[name]["value"]


def int8_prior(platform: Platform) -> float:
    """Static int8's document throughput over the base graph's on ``platform``, assumed until measured there:
    with int8 dot products over a bf16 or an fp32 base graph, with AMX, emulated (no int8 dot products), or as
    ``RETR_INT8_DOT`` forces it."""
    if platform.int8_forced is not None:
        return prior("int8_over_bf16" if platform.int8_forced else "int8_emulated")
    if platform.amx:
        return prior("int8_with_amx")
    if not platform.int8_dot:
        return prior("int8_emulated")
    return prior("int8_over_bf16" if platform.bf16 else "int8_over_fp32")


def weights_prior(platform: Platform) -> float:
    """The int8-weights graph's document throughput over the base graph's (int8 weights, activations quantised
    at run time, arithmetic in fp32 on every CPU), assumed until measured on ``platform``."""
    return prior("weights_over_bf16" if platform.bf16 else "weights_over_fp32")


@dataclass(frozen=True)
class Break:
    """Whether calibrating static int8 pays for a corpus: its saving against the base graph and its cost."""
    docs: int
    base_s: float  # seconds per document, base graph
    int8_s: float  # seconds per document, static int8
    calibration_s: float
    measured: bool  # int8_s and calibration_s measured here (else assumed: ``int8_prior``, the prior cost)
    # the graph ``base_s`` times, which the corpus takes where the calibration does not pay: the base graph
    # (``BASE``), or an int8 graph made without calibration (``registry.Backend.uncalibrated``) measured faster here
    against: str = BASE
    base_graph_s: float | None = None  # seconds per document, the base graph, where ``against`` is another graph
    base_estimated: bool = False  # ``base_s`` estimated from the model's multiply-adds at this CPU's probe rate

    @property
    def against_base(self) -> bool:
        return self.against == BASE

    @property
    def against_phrase(self) -> str:
        """The graph the corpus takes where the calibration does not pay, in words."""
        return "the base graph" if self.against_base else self.against

    @property
    def saving_s(self) -> float:
        return self.docs * (self.base_s - self.int8_s)

    @property
    def pays(self) -> bool:
        """int8 saves more than its calibration costs, and is fast enough to be worth its ranking noise
        (``faster_enough``)."""
        return faster_enough(self.base_s, self.int8_s) and self.saving_s > self.calibration_s

    @property
    def break_even_docs(self) -> float:
        gain = self.base_s - self.int8_s
        return self.calibration_s / gain if gain > 0 and faster_enough(self.base_s, self.int8_s) else float("inf")

    def break_even_phrase(self) -> str:
        """The break-even in words: "int8 pays from ~N documents", or "int8 is no faster here" where no corpus
        size pays (int8 not faster by more than the margin)."""
        even = self.break_even_docs
        return "int8 is no faster here" if even == float("inf") else f"int8 pays from ~{round(even)} documents"

    def to_dict(self) -> dict:
        return {**asdict(self), "saving_s": self.saving_s, "pays": self.pays,
                "break_even_docs": None if self.break_even_docs == float("inf") else round(self.break_even_docs)}


def calibration_pays(docs: int, base_s: float, platform: Platform, int8_s: float | None = None,
                     calibration_s: float | None = None) -> Break:
    """Whether ``docs`` documents save more by static int8 than its calibration costs: with int8's and the
    calibration's measured figures where they exist (``int8_s`` seconds per document, ``calibration_s``), else
    ``int8_prior`` and the ``calibration_s`` prior."""
    measured = int8_s is not None and calibration_s is not None
    return Break(docs, base_s, int8_s if int8_s is not None else base_s / int8_prior(platform),
                 calibration_s if calibration_s is not None else prior("calibration_s"), measured)


__all__ = ["BASE", "Break", "calibration_pays", "int8_prior", "prior", "priors", "weights_prior"]
