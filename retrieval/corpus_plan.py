"""Which graph encodes a corpus: the base graph; an int8 graph made without calibration (int8 weights, activations
quantised at run time: ``registry.WEIGHTS_INT8``) where int8 runs here and it is measured faster than the base
graph; or a calibrated backend's static int8 graph where the corpus is large enough for its saving over those to
exceed its calibration's cost on this CPU. The stored graph plan (``backends.plan``) holds the rule, made once and
read by every cache look-up (``graph_id``: nothing timed or tokenised); a corpus it leaves open is weighed on first
use (``corpus_weighing``, on the speeds of ``corpus_speeds``). And which graph encoded an index's documents
(``recorded_graph``), for documents added to it later."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np

from retr.retrieval.artifacts import cache_home
from retr.retrieval.backends import cost, sample_texts
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
from retr.retrieval.backends.plan import Plan, PlanStore, plan_key
from retr.retrieval.backends.platform import Platform
from retr.retrieval.backends.registry import BACKENDS, get_backend, on_this_cpu
from retr.retrieval.corpus_speeds import DocumentSpeeds
from retr.retrieval.corpus_weighing import Weighing
from retr.retrieval.errors import RetrError
from retr.retrieval.tokens import Tokens, prefixed

logger = logging.getLogger(__name__)

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
            brk = self.weighing.calibration_break(len(texts), tokens)
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
            logger.info("%s for %d documents: int8 is assumed no faster than the base graph on this CPU (x%.2f "
                        "until measured: `retr doctor --export` makes and times it): the base graph",
                        self.configured, docs, self.platform.int8_prior)
        return True

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
        stored = self.speeds.stored_per_token(cached) if cached is not None else None
        if stored is None:
            return None
        self.__dict__["calibrated_graph"] = cached
        # ``calibration_break``'s rule for a cached graph, on per-token seconds (it is the same at any token count)
        return CALIBRATED if cost.calibration_pays(self.min_docs, stored.base, self.platform, stored.int8,
                                                      0.0).pays else BASE

    @functools.cached_property
    def speeds(self) -> DocumentSpeeds:
        """The document graphs' per-token speeds here (timed once, stored)."""
        return DocumentSpeeds(self.exported, self.tokens, self.graph, self.token_budget, self.platform)

    @functools.cached_property
    def weighing(self) -> Weighing:
        """Whether a corpus pays for a calibration (``Weighing.calibration_break``)."""
        return Weighing(self)

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
        elif (large := self._settled()) is not None:
            why = "static int8 calibrated here and both graphs' speeds stored"
        elif self._none_can_pay(self.min_docs, say=False):
            large, why = BASE, f"static int8 assumed x{self.platform.int8_prior:.2f} here and not made"
        else:
            why = "each corpus weighed on first use until static int8 is calibrated here"
        return Plan(self.plan_key, self.exported.model_hash, self.configured, self.platform.cpu, self.min_docs, base,
                    self._key(large) if large else None, large, why,
                    self.calibration.digest if large == CALIBRATED else None)

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

    @functools.cached_property
    def _weights_name(self) -> str | None:
        """The configured backend's int8 graph made without calibration (``Backend.uncalibrated``), or None."""
        return get_backend(self.configured).uncalibrated

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
        if (stored := PlanStore(cache_home()).get(self.plan_key)) is not None and stored.large_graph != CALIBRATED:
            PlanStore(cache_home()).drop(self.plan_key)  # made since: the plan is made again
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



def recorded_graph(planner: CorpusPlanner, recorded: dict) -> Graph | None:
    """The graph that encoded an index's documents (``recorded``: that graph's info) where it is another than
    the base graph and this machine has it; None: the base graph encodes, with a warning where the recorded
    graph was calibrated (on the sample of another retr version, or on another machine) and is not in this
    machine's cache."""
    name = recorded.get("backend")
    if planner.graph is None or name == planner.graph.variant or name not in BACKENDS:
        return None
    if name == planner._weights_name:  # made without calibration: the same graph here
        return planner.weights_graph
    if get_backend(name).int8 and not get_backend(name).calibrated:  # another backend's, made the same way
        try:
            return planner.exported.open(name, base=planner.graph)
        except RetrError:  # refused here: the base graph
            return None
    if not get_backend(name).calibrated:
        return None
    digest = recorded.get("calibration")
    try:
        graph = planner.exported.find(name, Calibration((), digest)) if digest else None
    except RetrError:  # judged again since, and refused here
        graph = None
    if graph is None:
        logger.warning("the %s graph that encoded this index is not in the cache here: the new documents "
                       "are encoded by the %s graph (cosine to it >= %.3f)", name, planner.graph.variant,
                       recorded.get("check_cosine") or 0.0)
    return graph


__all__ = ["CorpusChoice", "CorpusPlan", "CorpusPlanner", "recorded_graph"]
