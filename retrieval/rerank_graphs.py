"""Which graph scores a cross-encoder's pairs on this machine: measured, not assumed from CPU flags (issue 39).

The candidates are the configured graph (made as usual: built, exported or from the cache) and every other
cross-encoder graph of the same model already in the cache that this machine can run (``chooser.prune``); each
passed its agreement check against torch when it was made. Here each is timed on one query's pairs at the rerank
depth (retr's fixed questions and passages, ``sample_texts``), its ranking noise against the configured graph is
measured on the same kind of pairs, and the fastest within ``CE_MAX_RANK_NOISE`` is chosen. The choice is stored
per model, candidates, depth, length, CPU and library versions, so that a later run reads it instead of timing.
Nothing is exported to make a candidate: `retr doctor --rerank MODEL --export` makes them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from retr.retrieval.backends import chooser, cost, sample_texts
from retr.retrieval.backends.batching import run_sorted
from retr.retrieval.backends.cost import prior
from retr.retrieval.backends.export import NOISE_QUESTIONS, Calibration, pair_noise
from retr.retrieval.backends.graphs import Graph, release_others
from retr.retrieval.backends.holder import ExportedModel, GraphChoice
from retr.retrieval.backends.platform import Platform
from retr.retrieval.backends.registry import BACKENDS, CE_MAX_RANK_NOISE
from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

# the cross-encoder's static int8 graph: made for a run whose queries repay it (``PairGraphs.worth_making``)
STATIC_INT8 = "openvino-int8"
# what making it costs until measured, and how long the configured graph is timed to weigh it: ``priors.json``
CE_STATIC_INT8_PRIOR_S = prior("ce_calibration_s")
WEIGH_BUDGET_S = prior("ce_weigh_budget_s")

def sample_pairs(depth: int, questions: int | None = None) -> list[tuple[str, list[str]]]:
    """retr's fixed questions, each with ``depth`` of its fixed passages (plain and joined, starting at the
    question's own: one relevant, the rest not), as a query's pairs at the rerank depth look."""
    docs = sample_texts.passages() + sample_texts.long_passages()
    qs = sample_texts.questions()[:questions] if questions else sample_texts.questions()
    return [(q, [docs[(i + j) % len(docs)] for j in range(depth)]) for i, q in enumerate(qs)]


def score_pairs(graph: Graph, ids: list, types: list, token_budget: int) -> np.ndarray:
    """One query's pairs (token ids, token type ids) through ``graph``: length-sorted batches under
    ``token_budget`` padded tokens, balanced over the runner's parallel streams (OpenVINO: one per core)."""
    return run_sorted(graph.runner, ids, token_budget, np.empty(len(ids), dtype=np.float32),
                      extra_rows={"token_type_ids": types}, parts=graph.runner.parallel)


@dataclass
class PairGraphs(GraphChoice):
    """A cross-encoder's candidate graphs and the measured choice among them."""
    role: ClassVar[str] = chooser.PAIRS
    bar: ClassVar[float] = CE_MAX_RANK_NOISE
    exported: ExportedModel  # the cross-encoder's graphs: found and named through it
    base: Graph  # the configured backend's graph: the reference of the noise check, and the fallback
    pair_ids: Callable[[str, list[str]], tuple[list, list]]  # (query, texts) -> (input ids, token type ids)
    depth: int
    max_length: int
    token_budget: int
    platform: Platform
    calibration: Callable[[], Calibration] | None = None  # what a static int8 candidate was calibrated on

    def score(self, graph: Graph, query: str, texts: list[str]) -> np.ndarray:
        """One query's pairs through ``graph``, batched as the reranker batches them."""
        return score_pairs(graph, *self.pair_ids(query, texts), self.token_budget)

    @functools.cached_property
    def candidates(self) -> dict[str, Graph]:
        """The configured graph first, then every other cross-encoder graph of this model in the cache that can
        run here (verified when made; none is made now)."""
        return {self.base.variant: self.base, **{b.name: g for b, g in self.exported.cached(
            self.base, self.platform, self.calibration)}}

    def seconds(self, graph: Graph, questions: int = 4, **timing) -> float:
        """Median seconds per query's ``depth`` pairs through ``graph`` (a few questions, bounded; ``timing``:
        ``chooser.time_per_unit``'s budget and rounds)."""
        pairs = sample_pairs(self.depth, questions)
        return chooser.time_per_unit(lambda: [self.score(graph, q, d) for q, d in pairs], len(pairs), **timing)

    @functools.cached_property
    def _base_scores(self) -> list[np.ndarray]:
        return [self.score(self.base, q, d) for q, d in sample_pairs(self.depth, NOISE_QUESTIONS)]

    def noise(self, graph: Graph) -> float:
        got = [self.score(graph, q, d) for q, d in sample_pairs(self.depth, NOISE_QUESTIONS)]
        return pair_noise(self._base_scores, got)

    @property
    def reference(self) -> Graph:
        return self.base

    @property
    def label(self) -> str:
        return f"cross-encoder pairs at depth {self.depth}"

    def key_ids(self) -> list[str]:
        ids = [self.exported.identity(g).key for g in self.candidates.values()]
        return [*ids, f"depth={self.depth}", f"max_length={self.max_length}", f"max_rank_noise={self.bar}"]

    def choice(self) -> chooser.Choice | None:
        """The stored choice, else one measured now; None where the configured graph is the only candidate."""
        return self.decide() if len(self.candidates) > 1 else None

    def worth_making(self, queries: int) -> cost.Break | None:
        """Whether this run's ``queries`` would save more through the model's static int8 graph than making it
        costs (``cost.calibration_pays``: the configured graph timed here on a query's pairs, static int8 at the
        platform's int8 prior, ``CE_STATIC_INT8_PRIOR_S``); None where there is nothing to weigh: that graph is
        in the cache already, was refused before, or this CPU has no int8 dot products."""
        static = BACKENDS[STATIC_INT8]
        if static.name in self.candidates or self.calibration is None or not chooser.prune(self.platform,
                                                                                           [static])[0]:
            return None
        try:
            self.exported.find(static, self.calibration())
        except RetrError:  # refused for this model before
            return None
        return cost.calibration_pays(queries, self.base_seconds(), self.platform,
                                        calibration_s=CE_STATIC_INT8_PRIOR_S)

    def base_seconds(self) -> float:
        """Seconds per query's pairs through the configured graph, as weighing static int8 needs it: timed once
        (~``WEIGH_BUDGET_S``) and stored per model, graph, depth, length, CPU and versions by the one chooser (a
        run that did not make it times nothing the next time)."""
        key = chooser.choice_key(self.exported.model_hash, chooser.PAIRS, [
            self.exported.identity(self.base).key, f"depth={self.depth}", f"max_length={self.max_length}",
            "weighing static int8"], self.platform)
        def decide(again: bool = False) -> float | None:
            choice = chooser.decide(chooser.PAIRS, key, {self.base.variant: self.base}, lambda name, graph: chooser.Timing(
                name, self.seconds(graph, questions=2, budget_s=WEIGH_BUDGET_S, min_rounds=2)), self.base.variant,
                model_hash=self.exported.model_hash, platform=self.platform, label="cross-encoder pairs, to weigh static int8",
                again=again)
            return choice.timings[0].seconds if choice.timings else None

        return decide() or decide(again=True)  # a stored choice without the time: timed again

    def chosen(self) -> tuple[Graph, chooser.Choice | None]:
        """The graph that scores pairs, and the choice that took it (None: the only candidate); the other
        candidates' sessions and compiled models are dropped (``release_others``)."""
        choice = self.choice()
        graph = self.candidates[choice.backend] if choice is not None else self.base
        if choice is not None:
            release_others(self.candidates, graph)
        return graph, choice


__all__ = ["CE_STATIC_INT8_PRIOR_S", "NOISE_QUESTIONS", "STATIC_INT8", "PairGraphs", "sample_pairs", "score_pairs"]
