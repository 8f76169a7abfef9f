"""One stored graph plan per model, configured backend, CPU and library versions: which graph encodes the documents
of a corpus below and at its calibration size, made once (on first use, or by `retr doctor`), stored in
``$RETR_CACHE/plans/`` and read by the encoders. The embedding and index cache keys are read from it
(``Plan.document_key``): a look-up times nothing and tokenises nothing.

A plan whose documents rule is not settled (``Plan.large`` None: static int8 runs here, is not calibrated
yet and may pay for a large enough corpus) leaves that corpus to be weighed on first use (``CorpusPlanner.choice``:
its timings stored), and is made again on the next read, until it settles. The roles' measured choices (queries,
pairs) are made by the one chooser (``chooser.decide``) and stored per candidate set beside it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from retr.retrieval.backends.chooser import choice_key
from retr.retrieval.backends.export import EMBEDDING, Calibration
from retr.retrieval.backends.graphs import EXPORT_GENERATION, cache_folder
from retr.retrieval.backends.platform import Platform
from retr.retrieval.backends.registry import get_backend
from retr.retrieval.backends.timing import read_stored, store

logger = logging.getLogger(__name__)

PLAN_FORMAT = 1
PLANS = "plans"  # under $RETR_CACHE


@dataclass(frozen=True)
class Plan:
    """Which graph does which work for one model on this machine (``key``: what it is valid for). Documents: the
    graph ``small`` (a graph key) under ``min_docs`` documents; ``large`` at ``min_docs`` and above
    (``large_graph``: ``base`` or ``calibrated``), or None where that is weighed per corpus until settled; ``why``
    in words."""
    key: str
    model_hash: str
    backend: str  # the backend configured
    cpu: str
    min_docs: int
    small: str
    large: str | None
    large_graph: str | None
    why: str
    calibration: str | None = None  # the digest of the calibrated graph ``large`` names, where it names one

    def document_key(self, docs: int) -> str | None:
        """The key of the graph that encodes a corpus of ``docs`` documents; None: weighed on first use."""
        return self.small if docs < self.min_docs else self.large

    @property
    def settled(self) -> bool:
        return self.large is not None

    def present(self, root: Path) -> bool:
        """Whether the calibrated graph the plan names is in the cache at ``root`` (a plan naming one that is gone is
        made again: a corpus is then weighed once more rather than keyed by a graph that is not there)."""
        if self.calibration is None:
            return True
        folder = cache_folder(root, self.model_hash, get_backend(self.backend), EMBEDDING,
                              Calibration((), self.calibration))
        return (folder / "manifest.json").is_file()

    def to_dict(self) -> dict:
        return {"format": PLAN_FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        """A stored plan; ``ValueError`` / ``KeyError`` where it is not what ``to_dict`` writes (a damaged file)."""
        if d.get("format") != PLAN_FORMAT:
            raise ValueError(f"format {d.get('format')!r}, not {PLAN_FORMAT}")
        plan = cls(**{f.name: d[f.name] for f in fields(cls)})
        texts = (plan.key, plan.model_hash, plan.backend, plan.cpu, plan.small, plan.why)
        if not all(isinstance(v, str) for v in texts) or type(plan.min_docs) is not int or plan.min_docs < 0 \
                or not all(v is None or isinstance(v, str) for v in (plan.large, plan.large_graph, plan.calibration)) \
                or (plan.large is None) != (plan.large_graph is None):
            raise ValueError("a field is not what a plan holds")
        return plan


def plan_key(model_hash: str, backend: str, max_length: int, min_docs: int, platform: Platform) -> str:
    """What a plan is valid for (``chooser.choice_key``: the model, the CPU's model string and precision, the
    library versions), with the backend configured, its length and calibration size, whether static int8 runs here
    (``RETR_INT8_DOT`` included) and how graphs are exported. Any of them changes: another plan."""
    return choice_key(model_hash, "plan", [f"format={PLAN_FORMAT}", f"backend={backend}", f"max_length={max_length}",
                                           f"min_docs={min_docs}", f"export={EXPORT_GENERATION}",
                                           f"int8={platform.static_int8}/{platform.int8_forced}"], platform)


@dataclass(frozen=True)
class PlanStore:
    """Plans kept under ``<root>/plans/<key>.json`` (JSON, written atomically, checked on read)."""
    root: Path

    def path(self, key: str) -> Path:
        return self.root / PLANS / f"{key}.json"

    def get(self, key: str) -> Plan | None:
        """The plan stored under ``key``; None where there is none, or it is damaged (a warning: made again)."""
        plan = read_stored(self.path(key), Plan.from_dict, "graph plan", "made again")
        if plan is not None and plan.key != key:
            logger.warning("stored graph plan %s is another's (%s): made again", self.path(key), plan.key)
            return None
        return plan if plan is not None and plan.present(self.root) else None

    def put(self, plan: Plan) -> None:
        store(self.path(plan.key), plan.to_dict())

    def drop(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)


__all__ = ["Plan", "PlanStore", "plan_key"]
