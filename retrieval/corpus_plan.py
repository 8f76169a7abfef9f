"""Which graph encodes a corpus, decided once per corpus size: the base graph; an int8 graph made without
calibration (int8 weights, activations quantised at run time: ``registry.WEIGHTS_INT8``) where int8 runs here and
it is measured faster than the base graph; or a calibrated backend's static int8 graph where the corpus is large
enough for its saving over those to exceed its calibration's cost on this CPU. The name of that graph in cache
keys, taken from the same decision; and which graph encoded an index's documents (``like``), for documents added
to it later."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from retr.retrieval.artifacts import cache_home
from retr.retrieval.backends import chooser, cost, sample_texts
from retr.retrieval.backends.batching import row_key, run_sorted
from retr.retrieval.backends.cost import prior
from retr.retrieval.backends.export import Calibration
from retr.retrieval.backends.graphs import (
    EXPORT_GENERATION,
    Graph,
    GraphId,
    graph_info,
    release_memory,
    release_others,
)
from retr.retrieval.backends.holder import ExportedModel
from retr.retrieval.backends.plan import DocumentRule, Plan, PlanStore, plan_key
from retr.retrieval.backends.platform import Platform
from retr.retrieval.backends.registry import BACKENDS, get_backend, on_this_cpu
from retr.retrieval.errors import RetrError
from retr.retrieval.tokens import Tokens, prefixed

logger = logging.getLogger(__name__)

# the priors (assumed until measured here) and the timing's bounds, each with its source: ``priors.json``
PER_TOKEN_BUDGET_S = prior("per_token_budget_s")  # the base and int8 graphs timed in alternation, at most
PER_TOKEN_MIN_ROUNDS = int(prior("per_token_min_rounds"))  # ... at least this many rounds
PER_TOKEN_CLEAR_RATIO = prior("per_token_clear_ratio")  # ... and no more once each put one ahead by this
STATIC_OVER_WEIGHTS = prior("static_over_weights")  # static int8 over the int8-weights graph, until measured
WEIGHTS_MAKE_S = prior("weights_make_s")  # making the int8-weights graph from the base graph and checking it
WEIGHTS_TIME_S = prior("weights_time_s")  # ... and timing it
# the base graph goes untimed where, its speed estimated from this CPU's precision probe, static int8 would still
# save more than this many times its calibration's cost (``_estimated_break``)
ESTIMATE_MARGIN = prior("estimate_margin")
# the base graph's timing is warmed up on this many of the sample's shortest passages per stream
WARM_UP_ROWS_PER_STREAM = 2
# a corpus's encoding through the static int8 graph measures that graph (``record_encoding``): stored with the
# base graph's speed as that run weighed it, it stands for the alternating timing where int8 was faster by more
# than this (MiniLM, AMX Xeon with AMX refused: 2.2-2.3x timed in alternation, 2.0-3.7x as observed)
OBSERVED_CLEAR_RATIO = PER_TOKEN_CLEAR_RATIO
# how the base and int8 graphs' per-token seconds were measured, part of the key they are stored under
ALTERNATING = f"per-token, alternating, {PER_TOKEN_BUDGET_S} s"
OBSERVED = "per-token, int8 from a corpus's encoding, base as weighed"

BASE, WEIGHTS, CALIBRATED = cost.BASE, "weights", "calibrated"  # the graphs a corpus can go through


@dataclass(frozen=True)
class CorpusPlan:
    """Documents ready to encode: their texts (document prompt applied), the graph they go through and its token
    ids (graph and tokens None: torch encodes the texts)."""
    texts: list[str]
    graph: Graph | None
    tokens: list | None
    truncation: dict | None = None  # Tokens.truncation of the texts, from the same tokenisation as ``tokens``
    choice: dict | None = None  # how the graph was chosen, where it was measured (cost.Break.to_dict)

    def graph_info(self) -> dict:
        """``graph_info`` of its graph, with the measured choice where there was one."""
        info = graph_info(self.graph)
        return {**info, "chosen": self.choice} if self.choice is not None else info


@dataclass(frozen=True)
class PerToken:
    """Seconds per token of the base graph and of an int8 graph on this machine, as stored: timed against each
    other in alternation, or ``observed`` (the int8 graph's from an earlier corpus's own encoding, the base graph's
    as that run weighed it: ``base_estimated`` where estimated from the precision probe)."""
    base: float
    int8: float
    observed: bool = False
    base_estimated: bool = False


@dataclass(frozen=True)
class CorpusChoice:
    """What a corpus of some size goes through: ``BASE``, ``WEIGHTS`` (the int8 graph made without calibration)
    or ``CALIBRATED`` (the base graph stands in where either is refused), and the break where one was weighed
    (``cost.Break.to_dict``)."""
    graph: str
    measured: dict | None = None

    @property
    def calibrated(self) -> bool:
        return self.graph == CALIBRATED


class CorpusPlanner:
    """The plan of which graph encodes a corpus, for one model. ``graph``: the documents' base graph (None: torch
    encodes everything); ``backend``: the backend it stands for (``BiEncoder.backend``); ``configured``: the
    backend asked for (calibrated or not); corpora under ``min_docs`` documents take the base graph."""

    def __init__(self, exported: ExportedModel, tokens: Tokens, graph: Graph | None, *, backend: str,
                 configured: str, min_docs: int, token_budget: int, platform: Platform):
        self.exported = exported
        self.tokens = tokens
        self.graph = graph
        self.backend = backend
        self.configured = configured
        self.min_docs = min_docs
        self.token_budget = token_budget
        self.platform = platform
        self._choices: dict[tuple[int, int], CorpusChoice] = {}  # per corpus size: the break is timed once
        self._tokenized: tuple | None = None  # the last texts' (key, ids, untruncated counts): keyed, then planned

    @functools.cached_property
    def corpus_backend(self) -> str:
        """The backend whose graph a corpus (of ``min_docs``+ documents) goes through on this CPU: ``backend``, or
        the graph that stands in where a calibrated backend does not pay here (``registry.on_this_cpu``, which
        says so once)."""
        if self.graph is None or on_this_cpu(get_backend(self.configured), platform=self.platform).name \
                == self.configured:
            return self.backend
        return self.graph.variant

    @property
    def size_matters(self) -> bool:
        """Whether the graph a corpus goes through depends on its size here (a calibrated backend whose int8 can
        run on this CPU)."""
        return self.graph is not None and get_backend(self.configured).calibrated \
            and self.corpus_backend == self.backend

    def _tokens(self, texts: list[str]) -> tuple[list, np.ndarray | None]:
        """``Tokens.counted`` of ``texts`` (document prompt applied), kept for the same texts asked again: a build
        names the graph (``graph_id``) before it plans the encoding (``plan``), and tokenises once."""
        key = (len(texts), hash(tuple(texts)))
        if self._tokenized is None or self._tokenized[0] != key:
            self._tokenized = (key, *self.tokens.counted(texts))
        return self._tokenized[1], self._tokenized[2]

    def choice(self, texts: list[str]) -> CorpusChoice:
        """Whether ``texts`` (a corpus, document prompt applied) go through the calibrated graph: at least
        ``min_docs`` of them, a CPU where int8 runs, and a calibration that pays for their tokens
        (``calibration_break``; RETR_INT8_DOT=1: int8 whatever it costs). Decided once per corpus size."""
        early = self._by_size(texts)
        if early is not None:
            return early
        unweighed = (len(texts), -1)  # decided whatever the corpus's tokens: none counted
        if unweighed in self._choices or self._none_can_pay(len(texts)):
            return self._choices.setdefault(unweighed, CorpusChoice(BASE, self._unweighed(len(texts))))
        tokens = sum(len(r) for r in self._tokens(texts)[0])  # what the graph will run: truncated
        key = (len(texts), tokens)
        if key not in self._choices:
            brk = self.calibration_break(len(texts), tokens)
            self._choices[key] = CorpusChoice(BASE, self._unweighed(len(texts))) if brk is None \
                else CorpusChoice(CALIBRATED if brk.pays else BASE if brk.against_base else WEIGHTS, brk.to_dict())
            if self._choices[key].graph != WEIGHTS and self.__dict__.pop("weights_graph", None) is not None:
                release_memory()  # made and timed to decide, not taken: its compiled streams go before a calibration
        return self._choices[key]

    def _unweighed(self, docs: int) -> dict:
        """What a choice made without weighing a calibration records."""
        return {"docs": docs, "pays": False, "measured": False, "int8_prior": self.platform.int8_prior}

    def _none_can_pay(self, docs: int, say: bool = True) -> bool:
        """Whether no corpus could pay for a calibration here, so nothing is timed or counted: static int8 is not
        made yet and assumed no faster than the base graph on this CPU (AMX: ``Platform.int8_prior`` <= 1; timing
        would be ~1.5 s of a first run, and counting SciFact's tokens ~1 s of a `retr eval` whose index is
        cached). Said in an info line."""
        if self.platform.int8_prior > 1 or self.exported.find(self.configured, self.calibration) is not None:
            return False
        if say:
            self._say_none_can_pay(docs)
        return True

    def _say_none_can_pay(self, docs: int) -> None:
        logger.info("%s for %d documents: int8 is assumed no faster than the base graph on this CPU (x%.2f "
                    "until measured: `retr doctor --export` makes and times it): the base graph", self.configured,
                    docs, self.platform.int8_prior)

    def _by_size(self, texts: list[str]) -> CorpusChoice | None:
        """The choice where no timing enters it: the base graph under ``min_docs`` documents (or where the size
        does not matter here), static int8 where forced (RETR_INT8_DOT=1: tests, benchmarks); else None."""
        if not self.size_matters or len(texts) < self.min_docs:
            return CorpusChoice(BASE)
        if self.platform.int8_forced:
            return CorpusChoice(CALIBRATED)
        return None

    def _settled(self) -> str | None:
        """What any corpus of ``min_docs``+ documents goes through where the calibrated graph is cached and both
        graphs' per-token speeds are stored: the calibration then costs nothing, so the choice is static int8
        wherever it is faster by the margin, whatever the corpus's token count (``calibration_break`` decides the
        same from them); None where that is not settled yet. A build's cache key then needs no tokenisation
        (SciFact's 5,183 documents: ~1.2 s of a `retr eval` whose index is cached)."""
        cached = self.exported.find(self.configured, self.calibration)
        stored = self._stored_per_token(cached) if cached is not None else None
        if stored is None:
            return None
        self.__dict__["calibrated_graph"] = cached
        # ``calibration_break``'s rule for a cached graph, on per-token seconds (it is the same at any token count)
        return CALIBRATED if cost.calibration_pays(self.min_docs, stored.base, self.platform, stored.int8,
                                                      0.0).pays else BASE

    @functools.cached_property
    def plan_key(self) -> str:
        """What this model's stored graph plan is valid for (``plan.plan_key``)."""
        return plan_key(self.exported.model_hash, self.configured, self.exported.max_length, self.min_docs,
                        self.platform)

    def stored_plan(self, again: bool = False) -> Plan:
        """The graph plan stored for this model here, made now (and stored) where there is none, it had not
        settled, or ``again`` (`retr doctor`). Making it times nothing and tokenises no corpus (``_make_plan``)."""
        store = PlanStore(cache_home())
        found = None if again else self.__dict__.get("_plan") or store.get(self.plan_key)
        if found is None or not found.settled:
            made = self._make_plan()
            if made != found:
                store.put(made)
            found = made
        if found.settled:
            self.__dict__["_plan"] = found
        return found

    def _make_plan(self) -> Plan:
        """The plan from what this machine has stored, with nothing timed: the base graph under ``min_docs``
        documents; at or above it the base graph where the size does not change the graph here or no corpus could
        pay for a calibration (``_none_can_pay``), static int8 where forced, the graph ``_settled`` names where the
        calibrated graph is cached and both graphs' speeds are stored; else left to be weighed on first use."""
        base = self._key(BASE)
        if not self.size_matters:
            large, why = BASE, "the corpus's size does not change its graph here"
        elif self.platform.int8_forced:
            large, why = CALIBRATED, "static int8 forced (RETR_INT8_DOT=1)"
        else:
            large = self._settled()
            why = "static int8 calibrated here and both graphs' speeds stored"
            if large is None and self._none_can_pay(self.min_docs, say=False):
                large, why = BASE, f"static int8 assumed x{self.platform.int8_prior:.2f} here and not made"
            elif large is None:
                why = "each corpus weighed on first use until static int8 is calibrated here"
        rule = DocumentRule(self.min_docs, base, self._key(large) if large else None, large, why)
        return Plan(self.plan_key, self.exported.model_hash, self.configured, self.platform.cpu, rule)

    def _key(self, chosen: str) -> str:
        """The cache key of the graph ``chosen`` (``BASE``, ``WEIGHTS``, ``CALIBRATED``) names: the backend; for
        the calibrated graph the sample it is calibrated on (another retr sample, another graph, other vectors);
        for an exported one how it was exported (``graphs.EXPORT_GENERATION``) and the precision it computes in
        on this CPU (bf16 or fp32: a cache shared by machines of both kinds holds both vectors)."""
        if self.graph is None:
            return self.exported.identity(None).key
        if chosen == CALIBRATED:  # only where int8 runs here
            return GraphId(self.exported.model_hash, self.backend, EXPORT_GENERATION, self.graph.precision,
                           self.calibration.digest).key
        if chosen == WEIGHTS and self.weights_graph is not None:  # made and timed by the choice
            return self.exported.identity(self.weights_graph).key
        return GraphId(self.exported.model_hash, self.graph.variant, EXPORT_GENERATION, self.graph.precision).key

    def graph_id(self, texts: list[str]) -> str:
        """What names the graph ``texts`` (a corpus, before the document prompt) go through, for cache keys: read
        from the stored plan (``stored_plan``), nothing timed or tokenised; only where the plan leaves a corpus of
        this size to be weighed (static int8 runs here, not calibrated yet) is it weighed now (``choice``: its
        timings stored, so the next corpus times nothing)."""
        if self.graph is None:
            return self._key(BASE)
        key = self.stored_plan().document_key(len(texts))
        if key is not None:
            return key
        return self._key(self.choice(prefixed(self.tokens.document_prompt, texts)).graph)

    def plan(self, texts: list[str]) -> CorpusPlan:
        """What encodes ``texts`` (document prompt applied): the graph ``choice`` names and the texts' token ids,
        with their truncation where the same tokenisation measures it."""
        if self.graph is None:
            return CorpusPlan(texts, None, None)
        tok, counts = self._tokens(texts)  # the ids and the untruncated lengths from one tokenisation
        truncation = self.tokens.truncation_of(counts) if counts is not None else None
        chosen = self.choice(texts)
        graph = {CALIBRATED: lambda: self.calibrated_graph, WEIGHTS: lambda: self.weights_graph,
                 BASE: lambda: None}[chosen.graph]() or self.graph
        if graph is not self.graph:  # timed, or the int8 graph's reference, and not what encodes the corpus
            release_others({"base": self.graph}, graph)  # compiled again on next use
        return CorpusPlan(texts, graph, tok, truncation, chosen.measured)

    def _sample_rows(self) -> list:
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
        """Seconds per token of ``graph`` on retr's sample passages (``_sample_rows``), in a short bounded run: a
        corpus's documents cost about their token count times this. Warmed up on the sample's shortest passages
        only (``_warm_up``)."""
        rows = self._sample_rows()
        return chooser.time_per_unit(self._encode_sample(graph, rows), sum(len(r) for r in rows), min_rounds=1,
                                     warm_up=self._warm_up(graph, rows))

    def tokens_seconds_alternating(self, graphs: list[Graph]) -> list[float]:
        """``token_seconds`` of each of ``graphs``, timed in alternation (``chooser.time_alternating``): their
        ratio is what decides, and a shared machine drifts between two runs timed one after the other."""
        rows = self._sample_rows()
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

    def calibration_break(self, docs: int, tokens: int) -> cost.Break | None:
        """Whether ``docs`` documents of ``tokens`` tokens in all pay for calibrating the static int8 graph, and
        what they go through where it does not. The static int8 graph timed here where it is already calibrated
        (then it costs nothing more) against the base graph. Else, on a CPU where int8 is assumed faster
        (``Platform.int8_prior`` > 1), the base graph timed here, and static int8 assumed from the platform
        (``cost.calibration_pays``); unless that clearly pays (``_calibration_clearly_pays``), the int8 graph
        made without calibration (``weights_graph``, ~3-5 s to make and check, once per model) is timed too, and
        where it is more than ``NOISE_FREE_MARGIN`` faster than the base graph static int8 is assumed
        ``STATIC_OVER_WEIGHTS`` times faster than it and weighed against it; it is neither made nor timed where,
        assumed ``Platform.weights_prior`` times the base graph, it could not save the corpus what weighing it
        costs this run (``_weights_may_pay``). The two graphs' timings are stored once per model, graphs, CPU and
        versions: a later corpus times neither.
        None, with nothing timed, where int8 is not made yet and assumed no faster here (AMX): no corpus could
        pay, so timing (~1.5 s of a first run) would decide nothing. Said in an info line."""
        per_doc = tokens / max(1, docs)
        cached = self.exported.find(self.configured, self.calibration)
        quiet = False  # both graphs' speeds read from the store: nothing weighed now, said at debug level only
        if cached is not None:
            self.__dict__["calibrated_graph"] = cached
            quiet = self._stored_per_token(cached) is not None
            speeds = self.measured_per_token(cached)
            brk = replace(cost.calibration_pays(docs, speeds.base * per_doc, self.platform, speeds.int8 * per_doc,
                                                   0.0), base_estimated=speeds.base_estimated)
        elif self.platform.int8_prior <= 1:
            self._say_none_can_pay(docs)
            return None
        else:
            name, key = self._weights_name, self._weights_speeds_key()
            stored = self._stored_pair(key, name) if name else None  # both graphs, timed here before
            estimated = self._estimated_break(docs, per_doc) if stored is None else None
            if estimated is not None:
                self._log_break(estimated, per_doc)
                return estimated
            base_s = stored.base * per_doc if stored else self.doc_seconds(self.graph, per_doc)
            # static int8 as the platform assumes it against the base graph, its calibration as the prior says
            brk = cost.calibration_pays(docs, base_s, self.platform)
            weighing_s = 0.0 if stored else self._weights_cost_s()
            if not self._calibration_clearly_pays(brk, weighing_s) \
                    and (stored or (self._weights_may_pay(docs, base_s, weighing_s) and self.weights_graph is not None)):
                weights_s = stored.int8 * per_doc if stored else self.doc_seconds(self.weights_graph, per_doc)
                if not stored:
                    self._store_pair(key, base_s / per_doc, name, weights_s / per_doc)
                faster = chooser.faster_enough(base_s, weights_s) and self.weights_graph is not None
                logger.info("%s for %d documents: base graph %.1f ms/doc, %s %.1f ms/doc (%s): %s", self.configured,
                            docs, base_s * 1000, name, weights_s * 1000, "stored" if stored else "measured",
                            name if faster else "the base graph")
                if faster:  # static int8 assumed from this measured int8 graph: the nearer of the two in kind
                    brk = replace(brk, base_s=weights_s, int8_s=weights_s / STATIC_OVER_WEIGHTS, against=name,
                                  base_graph_s=base_s)
        self._log_break(brk, per_doc, logging.DEBUG if quiet else logging.INFO)
        return brk

    def _log_break(self, brk: cost.Break, per_doc: float, level: int = logging.INFO) -> None:
        logger.log(level, "%s for %d documents (%.0f tokens each): %s %.1f ms/doc%s, int8 %.1f ms/doc (%s), "
                    "calibration %.0f s: %s", self.configured, brk.docs, per_doc,
                    "base graph" if brk.against_base else brk.against, brk.base_s * 1000,
                    " (estimated from this CPU's precision probe, not timed)" if brk.base_estimated else "",
                    brk.int8_s * 1000, "measured" if brk.measured else "assumed", brk.calibration_s,
                    "int8" if brk.pays else f"{brk.against_phrase} ({brk.break_even_phrase()})")

    @functools.cached_property
    def _spec(self):
        """The model's ``direct.BertSpec`` (its multiply-adds per token), or None where the graph is not built
        from a BERT's weights."""
        from retr.retrieval.backends.direct import bert_spec

        return bert_spec(self.exported.ref.path) if self.exported.ref.path is not None else None

    def _estimated_break(self, docs: int, per_doc: float) -> cost.Break | None:
        """Static int8 weighed against the base graph with the base graph's speed estimated instead of timed (~1
        s of a first run): its multiply-adds per document (``BertSpec.macs_per_token``) at the rate this CPU's
        precision probe measured in the base graph's precision (``PrecisionTiming.macs_per_second``), where static
        int8, assumed at the platform's prior, saves more than ``ESTIMATE_MARGIN`` times its calibration's prior
        cost and clearly pays against the int8-weights graph too (``_calibration_clearly_pays``). None where it
        does not, or where there is no probe or spec: the base graph is timed."""
        probe, spec = self.platform.precision_probe, self._spec
        if probe is None or spec is None:
            return None
        base_s = per_doc * spec.macs_per_token(per_doc) / probe.macs_per_second(self.graph.precision)
        brk = replace(cost.calibration_pays(docs, base_s, self.platform), base_estimated=True)
        wide = replace(brk, calibration_s=brk.calibration_s * ESTIMATE_MARGIN)
        return brk if wide.pays and self._calibration_clearly_pays(brk, self._weights_cost_s()) else None

    @functools.cached_property
    def _weights_name(self) -> str | None:
        """The configured backend's int8 graph made without calibration (``Backend.uncalibrated``), or None."""
        return get_backend(self.configured).uncalibrated

    def _weights_speeds_key(self) -> str | None:
        """What the base and int8-weights graphs' per-token seconds are stored under (``chooser.choice_key``: the
        model, both graphs' identities, the CPU, versions); None where the backend names no int8-weights graph."""
        name = self._weights_name
        if name is None:
            return None
        weights = GraphId(self.exported.model_hash, name, EXPORT_GENERATION, get_backend(name).precision())
        ids = [self.exported.identity(self.graph).key, weights.key, "per-token, base then int8 weights"]
        return chooser.choice_key(self.exported.model_hash, chooser.DOCUMENTS, ids, self.platform)

    def _stored_pair(self, key: str, other: str) -> PerToken | None:
        """Seconds per token of the base graph and of the ``other`` backend's graph (an int8 one) as stored under
        ``key`` (a property of the machine: a later corpus times neither), or None."""
        stored = chooser.ChoiceStore(cache_home()).get(key)
        timed = {t.backend: t for t in stored.timings} if stored is not None else {}
        if {self.graph.variant, other} <= set(timed) and all(t.seconds is not None for t in timed.values()):
            base = timed[self.graph.variant]
            return PerToken(base.seconds, timed[other].seconds, base_estimated=base.estimated)
        return None

    def _store_pair(self, key: str, base_t: float, other: str, other_t: float, *, base_estimated: bool = False,
                    why: str = "") -> None:
        """Seconds per token of the base graph (``base_estimated``: estimated, not timed) and of the ``other``
        backend's graph (``why``: how it was measured, where not timed here), stored under ``key``."""
        timings = [chooser.Timing(self.graph.variant, base_t, estimated=base_estimated),
                   chooser.Timing(other, other_t, why=why)]
        chooser.ChoiceStore(cache_home()).put(key, chooser.choose(chooser.DOCUMENTS, timings, self.graph.variant),
                                              model_hash=self.exported.model_hash, cpu=self.platform.cpu,
                                              unit_note="seconds per token")

    def _weights_cost_s(self) -> float:
        """Seconds this run would spend weighing the int8-weights graph whose speed is not stored: made and
        checked (``WEIGHTS_MAKE_S``) unless the cache holds it, then timed (``WEIGHTS_TIME_S``); nothing where it
        was refused here before (``weights_graph`` says so once asked). A cached graph found here is the one
        ``weights_graph`` returns: not looked up and checked twice."""
        if "weights_graph" not in self.__dict__:
            name = self._weights_name
            try:
                found = self.exported.find(name) if name is not None and self.graph is not None else None
            except RetrError:  # refused here before: nothing will be made or timed
                return 0.0
            if found is None:
                return WEIGHTS_MAKE_S + WEIGHTS_TIME_S
            self.__dict__["weights_graph"] = found
        return WEIGHTS_TIME_S if self.__dict__["weights_graph"] is not None else 0.0

    def _weights_may_pay(self, docs: int, base_s: float, weighing_s: float) -> bool:
        """Whether an int8-weights graph ``Platform.weights_prior`` times faster than the base graph (``base_s``
        seconds a document) would save ``docs`` documents more than weighing it costs this run (``weighing_s``);
        else it is neither made nor timed, and says so (1,000 NPL-length documents, ~6 ms each through the fp32
        base graph on 2 cores: ~2.4 s saved for ~5 s spent; over a bf16 base graph, assumed ~1.1x, only a corpus
        on which static int8 clearly pays, so that this graph is not weighed, could repay it)."""
        saving = docs * base_s * (1 - 1 / self.platform.weights_prior)
        if saving > weighing_s:
            return True
        logger.info("%s for %d documents: %s not made, it would save ~%.1f s for ~%.1f s of making and timing it",
                    self.configured, docs, self._weights_name, saving, weighing_s)
        return False

    def _calibration_clearly_pays(self, brk: cost.Break, weights_cost_s: float) -> bool:
        """Whether static int8 (as ``brk`` assumes it) saves more than its calibration's cost even against an
        int8-weights graph ``Platform.weights_prior`` times faster than the base graph, once what weighing that
        graph would cost this run (``weights_cost_s``) is counted on its side: then that graph is neither made nor
        timed."""
        against_weights = replace(brk, base_s=brk.base_s / self.platform.weights_prior,
                                  calibration_s=max(0.0, brk.calibration_s - weights_cost_s))
        return brk.pays and against_weights.pays

    def measured_per_token(self, other: Graph) -> PerToken:
        """Seconds per token of the base graph and of ``other`` (an int8 graph), timed once per model, graphs,
        CPU and library versions and then read from the choice store: a property of the machine, not of the
        corpus, so a later corpus pays no timing (~2 s on 2 cores, the base graph compiled only to be timed).
        Not timed either where an earlier corpus's encoding observed them clearly apart (``_stored_per_token``)."""
        stored = self._stored_per_token(other)
        if stored is not None:
            return stored
        base_t, other_t = self.tokens_seconds_alternating([self.graph, other])
        self._store_pair(self._pair_key(other), base_t, other.variant, other_t)
        return PerToken(base_t, other_t)

    def _stored_per_token(self, other: Graph) -> PerToken | None:
        """The base graph's and ``other``'s seconds per token as stored on this machine: timed in alternation, else
        as observed by an earlier corpus's encoding (``record_encoding``) where int8 was faster there by more than
        ``OBSERVED_CLEAR_RATIO`` (a decision no timing would change); None: time them."""
        stored = self._stored_pair(self._pair_key(other), other.variant)
        if stored is not None:
            return stored
        seen = self._stored_pair(self._pair_key(other, OBSERVED), other.variant)
        if seen is None or not seen.base or not seen.int8 or seen.base < seen.int8 * OBSERVED_CLEAR_RATIO:
            return None
        return replace(seen, observed=True)

    def record_encoding(self, plan: CorpusPlan, seconds: float) -> None:
        """Keep what encoding a corpus through the static int8 graph measured (``seconds`` for ``plan``'s tokens),
        with the base graph's seconds per token as this run weighed it (timed, or estimated from the probe:
        ``Break.base_estimated``), where neither pair is stored yet: a later corpus reads them
        (``_stored_per_token``) instead of timing both graphs in alternation (~4 s of its run, and the base graph
        compiled beside the int8 one). Only where the corpus took the calibrated graph by a weighed break
        (``plan.choice``) that paid; the encoding's first batches compile the graph's streams, so int8 reads a
        little slow: on the side of timing again."""
        brk, graph = plan.choice, self.__dict__.get("calibrated_graph")
        if graph is None or plan.graph is not graph or not brk or not brk.get("pays") or not plan.tokens \
                or seconds <= 0 or self._stored_per_token(graph) is not None:
            return
        base_doc = brk["base_s"] if brk.get("against") == cost.BASE else brk.get("base_graph_s")
        tokens = sum(len(r) for r in plan.tokens)
        if not base_doc or not tokens:
            return
        per_doc = tokens / len(plan.tokens)
        self._store_pair(self._pair_key(graph, OBSERVED), base_doc / per_doc, graph.variant, seconds / tokens,
                         base_estimated=bool(brk.get("base_estimated")),
                         why=f"encoding {len(plan.tokens)} documents")
        logger.info("%s: %.1f ms per document encoding %d documents (base graph %.1f ms, %s): stored for later "
                    "corpora", graph.variant, seconds / len(plan.tokens) * 1000, len(plan.tokens), base_doc * 1000,
                    "estimated" if brk.get("base_estimated") else "timed")

    def _pair_key(self, other: Graph, procedure: str = ALTERNATING) -> str:
        """What the base graph's and ``other``'s per-token seconds, measured by ``procedure`` (``ALTERNATING``, or
        ``OBSERVED``: ``record_encoding``'s), are stored under (``chooser.choice_key``: the model, both graphs'
        identities, the CPU, versions)."""
        ids = [self.exported.identity(self.graph).key, self.exported.identity(other).key, procedure]
        return chooser.choice_key(self.exported.model_hash, chooser.DOCUMENTS, ids, self.platform)

    @functools.cached_property
    def weights_graph(self) -> Graph | None:
        """The configured backend's int8 graph made without calibration (``Backend.uncalibrated``: int8 weights,
        activations quantised at run time; made from the base graph and checked, once per model, then cached);
        None where the backend names none, torch encodes, or it is refused here (a warning)."""
        name = self._weights_name
        if name is None or self.graph is None:
            return None
        try:
            return self.exported.open(name, base=self.graph)  # made from the base graph, checked against it
        except RetrError as e:
            logger.warning("%s refused (%s): corpora too small for a calibration are encoded by the %s graph", name,
                           e, self.graph.variant)
            return None

    @functools.cached_property
    def calibration(self) -> Calibration:
        """What a calibrated backend is calibrated on: retr's fixed sample of passages (joined ones too) and
        questions, as this model tokenises them, passages with the document prompt. One per model, not per
        corpus: a new corpus pays no calibration."""
        docs = prefixed(self.tokens.document_prompt, sample_texts.passages() + sample_texts.long_passages())
        return Calibration.of(self.tokens.ids(docs + sample_texts.questions()))

    @functools.cached_property
    def calibrated_graph(self) -> Graph | None:
        """The calibrated backend's graph for this model (calibrated and checked once, then cached); None, with a
        warning, when it is refused (it strays from torch or adds too much ranking noise), and None, with an info
        line and no calibration, on a CPU where it does not pay (``Backend.pays``): corpora then take the base
        graph."""
        backend = get_backend(self.configured)
        if self.corpus_backend != self.backend:  # it does not pay on this CPU: nothing to calibrate
            return None
        try:
            graph = self.exported.open(backend.name, self.calibration, base=self.graph)  # checked against it
        except RetrError as e:
            logger.warning("%s refused (%s): corpora are encoded by the %s graph", backend.name, e,
                           self.graph.variant)
            return None
        stored = PlanStore(cache_home()).get(self.plan_key)
        if stored is not None and stored.documents.large_graph != CALIBRATED:  # made since: the plan is made again
            PlanStore(cache_home()).drop(self.plan_key)
            self.__dict__.pop("_plan", None)
        return graph

    def release(self) -> None:
        """Drop what encoding a corpus held: the calibrated graph (its compiled model and its activations on every
        stream: ~0.2 GB for MiniLM; opened from the cache again, ~1 s, where another corpus needs it) and the
        corpus's token ids. A first `retr eval` then searches in the memory the encoding left."""
        self.__dict__.pop("calibrated_graph", None)
        self.__dict__.pop("weights_graph", None)
        self._tokenized = None
        release_memory()

    def like(self, recorded: dict) -> Graph | None:
        """The graph that encoded an index's documents (``recorded``: that graph's info) where it is another than
        the base graph and this machine has it; None: the base graph encodes, with a warning where the recorded
        graph was calibrated (on the sample of another retr version, or on another machine) and is not in this
        machine's cache."""
        name = recorded.get("backend")
        if self.graph is None or name == self.graph.variant or name not in BACKENDS:
            return None
        if name == self._weights_name:  # made without calibration: the same graph here
            return self.weights_graph
        if get_backend(name).int8 and not get_backend(name).calibrated:  # another backend's, made the same way
            try:
                return self.exported.open(name, base=self.graph)
            except RetrError:  # refused here: the base graph
                return None
        if not get_backend(name).calibrated:
            return None
        digest = recorded.get("calibration")
        try:
            graph = self.exported.find(name, Calibration((), digest)) if digest else None
        except RetrError:  # judged again since, and refused here
            graph = None
        if graph is None:
            logger.warning("the %s graph that encoded this index is not in the cache here: the new documents "
                           "are encoded by the %s graph (cosine to it >= %.3f)", name, self.graph.variant,
                           recorded.get("check_cosine") or 0.0)
        return graph


__all__ = ["CorpusChoice", "CorpusPlan", "CorpusPlanner", "PerToken"]
