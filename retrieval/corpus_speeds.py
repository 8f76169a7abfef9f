"""Seconds per token of a model's document graphs on this machine: timed on retr's fixed sample in short bounded
runs (the base graph against an int8 one in alternation), or observed while a corpus was encoded, and stored once
per model, graphs, CPU and library versions, so that a later corpus times neither graph. The graph plan
(``CorpusPlanner``) weighs a calibration on them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from retr.retrieval.artifacts import cache_home
from retr.retrieval.backends import chooser, cost, sample_texts
from retr.retrieval.backends.batching import row_key, run_sorted
from retr.retrieval.backends.cost import prior
from retr.retrieval.backends.graphs import EXPORT_GENERATION, Graph, GraphId
from retr.retrieval.backends.holder import ExportedModel
from retr.retrieval.backends.platform import Platform
from retr.retrieval.backends.registry import get_backend
from retr.retrieval.tokens import Tokens, prefixed

logger = logging.getLogger(__name__)

# the timing's bounds, each with its source: ``priors.json``
PER_TOKEN_BUDGET_S = prior("per_token_budget_s")  # the base and int8 graphs timed in alternation, at most
PER_TOKEN_MIN_ROUNDS = int(prior("per_token_min_rounds"))  # ... at least this many rounds
PER_TOKEN_CLEAR_RATIO = prior("per_token_clear_ratio")  # ... and no more once each put one ahead by this
# the base graph's timing is warmed up on this many of the sample's shortest passages per stream
WARM_UP_ROWS_PER_STREAM = 2
# a corpus's encoding through the static int8 graph measures that graph (``record_encoding``): stored with the
# base graph's speed as that run weighed it, it stands for the alternating timing where int8 was faster by more
# than this (MiniLM, AMX Xeon with AMX refused: 2.2-2.3x timed in alternation, 2.0-3.7x as observed)
OBSERVED_CLEAR_RATIO = PER_TOKEN_CLEAR_RATIO
# how the base and int8 graphs' per-token seconds were measured, part of the key they are stored under
ALTERNATING = f"per-token, alternating, {PER_TOKEN_BUDGET_S} s"
OBSERVED = "per-token, int8 from a corpus's encoding, base as weighed"


@dataclass(frozen=True)
class PerToken:
    """Seconds per token of the base graph and of an int8 graph on this machine, as stored: timed against each
    other in alternation, or ``observed`` (the int8 graph's from an earlier corpus's own encoding, the base graph's
    as that run weighed it: ``base_estimated`` where estimated from the precision probe)."""
    base: float
    int8: float
    observed: bool = False
    base_estimated: bool = False


class DocumentSpeeds:
    """The per-token speeds of one model's document graphs here. ``graph``: the base graph; ``token_budget``:
    padded tokens per batch, as a corpus is encoded."""

    def __init__(self, exported: ExportedModel, tokens: Tokens, graph: Graph, token_budget: int,
                 platform: Platform):
        self.exported = exported
        self.tokens = tokens
        self.graph = graph
        self.token_budget = token_budget
        self.platform = platform

    def sample_rows(self) -> list:
        """retr's sample passages, short and joined ones, as token ids (~6,500 tokens with MiniLM: batches enough
        to keep every stream busy, as a corpus does; a handful of passages ran one stream and measured 4x the time
        per token)."""
        return self.tokens.ids(prefixed(self.tokens.document_prompt,
                                        sample_texts.passages() + sample_texts.long_passages()))

    def _encode_sample(self, graph: Graph, rows: list) -> Callable[[], object]:
        """A timed run of ``graph`` over ``rows``, whose vectors it keeps (``Graph.known``: an int8 graph made from
        it reads them as its checks' reference)."""
        out = np.empty((len(rows), graph.dim), dtype=np.float32)
        keys = [row_key(r) for r in rows]

        def run():
            run_sorted(graph.runner, rows, self.token_budget, out)
            graph.known.update(zip(keys, out.copy(), strict=True))

        return run

    def token_seconds(self, graph: Graph) -> float:
        """Seconds per token of ``graph`` on retr's sample passages (``sample_rows``), in a short bounded run: a
        corpus's documents cost about their token count times this. Warmed up on the sample's shortest passages
        only (``_warm_up``)."""
        rows = self.sample_rows()
        return chooser.time_per_unit(self._encode_sample(graph, rows), sum(len(r) for r in rows), min_rounds=1,
                                     warm_up=self._warm_up(graph, rows))

    def tokens_seconds_alternating(self, graphs: list[Graph]) -> list[float]:
        """``token_seconds`` of each of ``graphs``, timed in alternation (``chooser.time_alternating``): their
        ratio is what decides, and a shared machine drifts between two runs timed one after the other."""
        rows = self.sample_rows()
        return chooser.time_alternating([self._encode_sample(g, rows) for g in graphs], sum(len(r) for r in rows),
                                        budget_s=PER_TOKEN_BUDGET_S, min_rounds=PER_TOKEN_MIN_ROUNDS,
                                        clear_ratio=PER_TOKEN_CLEAR_RATIO,
                                        warm_ups=[self._warm_up(g, rows) for g in graphs])

    def _warm_up(self, graph: Graph, rows: list) -> Callable[[], object]:
        """A run of ``graph`` over the shortest of ``rows``, two a stream: what compiles it and its streams before
        it is timed. A round over the whole sample right after compilation took what later rounds took (1.17
        against 0.99-1.13 s, 1.04 against 1.03-1.13 s; MiniLM's fp32 graph, 2 cores of an AMX Xeon with AMX
        refused), and a whole warm-up round was ~1 s of a corpus's first run."""
        shortest = sorted(rows, key=len)[: WARM_UP_ROWS_PER_STREAM * max(1, getattr(graph.runner, "parallel", 1))]
        return lambda: run_sorted(graph.runner, shortest, self.token_budget,
                                  np.empty((len(shortest), graph.dim), np.float32))

    def doc_seconds(self, graph: Graph, tokens_per_doc: float) -> float:
        """Seconds per document of ``tokens_per_doc`` tokens through ``graph`` (``token_seconds``)."""
        return self.token_seconds(graph) * tokens_per_doc

    def stored_pair(self, key: str, other: str) -> PerToken | None:
        """Seconds per token of the base graph and of the ``other`` backend's graph (an int8 one) as stored under
        ``key`` (a property of the machine: a later corpus times neither), or None."""
        stored = chooser.ChoiceStore(cache_home()).get(key)
        timed = {t.backend: t for t in stored.timings} if stored is not None else {}
        if {self.graph.variant, other} <= set(timed) and all(t.seconds is not None for t in timed.values()):
            base = timed[self.graph.variant]
            return PerToken(base.seconds, timed[other].seconds, base_estimated=base.estimated)
        return None

    def store_pair(self, key: str, base_t: float, other: str, other_t: float, *, base_estimated: bool = False,
                    why: str = "") -> None:
        """Seconds per token of the base graph (``base_estimated``: estimated, not timed) and of the ``other``
        backend's graph (``why``: how it was measured, where not timed here), stored under ``key``."""
        timings = [chooser.Timing(self.graph.variant, base_t, estimated=base_estimated),
                   chooser.Timing(other, other_t, why=why)]
        chooser.ChoiceStore(cache_home()).put(key, chooser.choose(chooser.DOCUMENTS, timings, self.graph.variant),
                                              model_hash=self.exported.model_hash, cpu=self.platform.cpu,
                                              unit_note="seconds per token")

    def measured_per_token(self, other: Graph) -> PerToken:
        """Seconds per token of the base graph and of ``other`` (an int8 graph), timed once per model, graphs,
        CPU and library versions and then read from the choice store: a property of the machine, not of the
        corpus, so a later corpus pays no timing (~2 s on 2 cores, the base graph compiled only to be timed).
        Not timed either where an earlier corpus's encoding observed them clearly apart (``stored_per_token``)."""
        stored = self.stored_per_token(other)
        if stored is not None:
            return stored
        base_t, other_t = self.tokens_seconds_alternating([self.graph, other])
        self.store_pair(self.pair_key(other), base_t, other.variant, other_t)
        return PerToken(base_t, other_t)

    def stored_per_token(self, other: Graph) -> PerToken | None:
        """The base graph's and ``other``'s seconds per token as stored on this machine: timed in alternation, else
        as observed by an earlier corpus's encoding (``record_encoding``) where int8 was faster there by more than
        ``OBSERVED_CLEAR_RATIO`` (a decision no timing would change); None: time them."""
        stored = self.stored_pair(self.pair_key(other), other.variant)
        if stored is not None:
            return stored
        seen = self.stored_pair(self.pair_key(other, OBSERVED), other.variant)
        if seen is None or not seen.base or not seen.int8 or seen.base < seen.int8 * OBSERVED_CLEAR_RATIO:
            return None
        return replace(seen, observed=True)

    def record_encoding(self, plan, seconds: float) -> None:  # ``plan``: a corpus_plan.CorpusPlan
        """Keep what encoding a corpus through the static int8 graph measured (``seconds`` for ``plan``'s tokens),
        with the base graph's seconds per token as this run weighed it (timed, or estimated from the probe:
        ``Break.base_estimated``), where neither pair is stored yet: a later corpus reads them
        (``stored_per_token``) instead of timing both graphs in alternation (~4 s of its run, and the base graph
        compiled beside the int8 one). Only where the corpus took the calibrated graph by a weighed break
        (``plan.choice``) that paid; the encoding's first batches compile the graph's streams, so int8 reads a
        little slow: on the side of timing again."""
        brk, graph = plan.choice, plan.graph if plan.graph is not None and plan.graph.backend.calibrated else None
        if graph is None or not brk or not brk.get("pays") or not plan.tokens \
                or seconds <= 0 or self.stored_per_token(graph) is not None:
            return
        base_doc = brk["base_s"] if brk.get("against") == cost.BASE else brk.get("base_graph_s")
        tokens = sum(len(r) for r in plan.tokens)
        if not base_doc or not tokens:
            return
        per_doc = tokens / len(plan.tokens)
        self.store_pair(self.pair_key(graph, OBSERVED), base_doc / per_doc, graph.variant, seconds / tokens,
                         base_estimated=bool(brk.get("base_estimated")),
                         why=f"encoding {len(plan.tokens)} documents")
        logger.info("%s: %.1f ms per document encoding %d documents (base graph %.1f ms, %s): stored for later "
                    "corpora", graph.variant, seconds / len(plan.tokens) * 1000, len(plan.tokens), base_doc * 1000,
                    "estimated" if brk.get("base_estimated") else "timed")

    def pair_key(self, other: Graph, procedure: str = ALTERNATING) -> str:
        """What the base graph's and ``other``'s per-token seconds, measured by ``procedure`` (``ALTERNATING``, or
        ``OBSERVED``: ``record_encoding``'s), are stored under (``chooser.choice_key``: the model, both graphs'
        identities, the CPU, versions)."""
        ids = [self.exported.identity(self.graph).key, self.exported.identity(other).key, procedure]
        return chooser.choice_key(self.exported.model_hash, chooser.DOCUMENTS, ids, self.platform)

    def weights_key(self, name: str | None) -> str | None:
        """What the base and the int8-weights graph ``name``'s per-token seconds are stored under
        (``chooser.choice_key``: the model, both graphs' identities, the CPU, versions); None where there is none."""
        if name is None:
            return None
        weights = GraphId(self.exported.model_hash, name, EXPORT_GENERATION, get_backend(name).precision())
        ids = [self.exported.identity(self.graph).key, weights.key, "per-token, base then int8 weights"]
        return chooser.choice_key(self.exported.model_hash, chooser.DOCUMENTS, ids, self.platform)


__all__ = ["DocumentSpeeds", "PerToken"]
