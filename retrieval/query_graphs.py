"""Which graph a query goes through: the one ``query_backend`` names, or, where none is named, the fastest for a
lone query on this machine among the graphs already in the cache that add no more ranking noise than
``MAX_QUERY_RANK_NOISE`` against the documents' graph (timed and checked once, then stored). The model's static
int8 graph is among them where a corpus has paid its calibration: calibrated once per model on retr's fixed sample
of passages and questions, not on a corpus, it costs a query nothing more to offer."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from retr.retrieval.backends import chooser, sample_texts
from retr.retrieval.backends.export import Calibration, pair_noise
from retr.retrieval.backends.graphs import (
    Graph,
    graph_info,
    lone_feed,
    lone_multiple,
    release_memory,
    release_others,
)
from retr.retrieval.backends.holder import ExportedModel, GraphChoice
from retr.retrieval.backends.platform import Platform
from retr.retrieval.backends.registry import MAX_RANK_NOISE, base_of
from retr.retrieval.errors import RetrError
from retr.retrieval.tokens import Tokens, prefixed

logger = logging.getLogger(__name__)

QUERY_THREADS = 1  # inference threads of a query graph of its own
# the most ranking noise a query candidate may add against the documents' graph: the documents' bar (onnx-int8 query
# vectors moved SciFact hybrid nDCG@10 0.7282 -> 0.7234 unchecked)
MAX_QUERY_RANK_NOISE = MAX_RANK_NOISE
ONE_STREAM = ":one-stream"  # a candidate's name suffix: the documents' OpenVINO graph as one stream of all threads


class QueryGraphs(GraphChoice):
    """The query graph of one model. ``documents``: the documents' graph (None: torch encodes queries too);
    ``given``: the query backend asked for (None: choose); ``backend``: the documents' backend (what a query takes
    where nothing is given and nothing else is chosen); ``run(graph, token rows)``: their vectors through a graph;
    ``calibration()``: what the model's calibrated graphs are calibrated on (None: none is offered)."""
    role, bar, label = chooser.QUERIES, MAX_QUERY_RANK_NOISE, "queries"

    def __init__(self, exported: ExportedModel, tokens: Tokens, documents: Graph | None, *, given: str | None,
                 backend: str, query_prompt: str, platform: Platform,
                 run: Callable[[Graph, list], np.ndarray], calibration: Callable[[], Calibration] | None = None):
        self.exported = exported
        self.tokens = tokens
        self.documents = documents
        self.given = given
        self.backend = backend
        self.query_prompt = query_prompt
        self.platform = platform
        self._run = run
        self._calibration = calibration

    @functools.cached_property
    def graph(self) -> Graph | None:
        """The graph queries go through: the query backend's (its base graph where calibrated: a query has no
        corpus to calibrate on), or the document graph when that one is refused or the same. Kept compiled in the
        cache from its next compilation on (``keep_compiled``): the next search reads it back."""
        graph = self._graph()
        keep = getattr(graph.runner, "keep_compiled", None) if graph is not None else None
        if keep is not None:
            keep(graph.path.parent, self.platform.cpu)
        return graph

    def _graph(self) -> Graph | None:
        if self.given is None and self.documents is not None:
            choice = self.choice
            graph = self.candidates.get(choice.backend) if choice is not None else None
            if graph is not None:
                # the documents' graph among them, where queries take another compiled graph: a search then holds
                # one compiled graph (documents encoded later compile theirs again, ~1 s)
                release_others(self.candidates, graph)
                return graph
        wanted = base_of(self.given or self.backend).name
        if self.documents is None or wanted in (self.documents.variant, "torch"):
            return self.documents
        try:
            # one thread: a short query gains nothing from a second (onnx-int8: 4.56 ms with one, 4.85 with two),
            # and concurrent queries (a server's) then run side by side on the cores: 480 against 294 queries/s
            return self.exported.open(wanted, threads=QUERY_THREADS) or self.documents
        except RetrError as e:  # e.g. int8 too far from torch for this model: queries take the document graph
            logger.warning("query backend %s refused (%s): queries use the %s graph", wanted, e,
                           self.documents.variant)
            return self.documents

    def _release_documents(self) -> None:
        """Drop the documents' compiled model once it is timed, before the next candidate is compiled: a search
        never holds two at once (MiniLM bf16 on an AMX Xeon: `retr eval`'s peak 593 MiB with both, 573 before the
        one-stream candidate). Compiled again where it is chosen, or documents are encoded later (~1 s)."""
        release = getattr(self.documents.runner, "release", None)
        if release is not None and release():
            release_memory()

    @functools.cached_property
    def candidates(self) -> dict[str, Graph]:
        """The graphs a query could take without making anything: the documents' graph, the same graph as one
        stream over all its threads (``one_stream``), and every other graph of a backend offered for queries
        (``Backend.queries``) this machine can run that is already in the cache: an OpenVINO one (the model's
        static int8 graph, where a corpus paid its calibration) as one stream over all its threads, an ONNX Runtime
        one on one thread."""
        found = {self.documents.variant: self.documents}
        one_stream = self.one_stream()
        if one_stream is not None:
            found[self.documents.variant + ONE_STREAM] = one_stream
        for b, graph in self.exported.cached(self.documents, self.platform, self._calibration, lambda b: b.queries,
                                             lambda b: None if b.runtime == "openvino" else QUERY_THREADS):
            single = _one_stream(graph) if b.runtime == "openvino" else None
            found[b.name + ONE_STREAM if single is not None else b.name] = single or graph
        return found

    @property
    def reference(self) -> Graph | None:
        return self.documents

    def one_stream(self) -> Graph | None:
        """The documents' OpenVINO graph compiled as one stream over all its threads (the same file: nothing to
        make or check against torch again), where it runs several streams; else None."""
        return _one_stream(self.documents)

    def seconds(self, graph: Graph) -> float:
        """Seconds per lone query through ``graph`` (retr's sample questions, one at a time; bounded)."""
        rows = self.tokens.ids(prefixed(self.query_prompt, sample_texts.questions()[:8]))
        feeds = [lone_feed(graph, r, self.exported.max_length) for r in rows]  # as a query runs
        return chooser.time_per_unit(lambda: [graph.runner(f) for f in feeds], len(feeds), budget_s=0.5)

    @functools.cached_property
    def _noise_sample(self) -> tuple[list, np.ndarray, np.ndarray]:
        """retr's fixed questions (token ids), their vectors through the documents' graph one at a time, and its
        fixed passages through that graph: what every query candidate is compared on (made once per encoder)."""
        questions = self.tokens.ids(prefixed(self.query_prompt, sample_texts.questions()))
        docs = self._run(self.documents, self.tokens.ids(prefixed(
            self.tokens.document_prompt, sample_texts.passages() + sample_texts.long_passages())))
        return questions, np.concatenate([self._run(self.documents, [r]) for r in questions]), docs

    def noise(self, graph: Graph) -> float:
        """Ranking noise ``graph``'s query vectors add against the documents' graph's (``export.pair_noise``):
        retr's fixed questions, one at a time, against its fixed passages as the documents' graph encodes them."""
        questions, base, docs = self._noise_sample
        got = np.concatenate([self._run(graph, [r]) for r in questions])
        return pair_noise(base @ docs.T, got @ docs.T)

    @functools.cached_property
    def choice(self) -> chooser.Choice | None:
        """Which graph a lone query is fastest through on this machine, among ``candidates`` (each passed its
        agreement check when it was made, and passes the ranking-noise check against the documents' graph here):
        timed and checked once, then stored per model, candidates, CPU and library versions. None: one candidate
        only (nothing to choose), or a query backend was given."""
        if self.given is not None or self.documents is None or len(self.candidates) < 2:
            return None
        return self.decide()

    def key_ids(self) -> list[str]:
        # each candidate as a query runs through it (padded or not: timed as it runs, so timed again if that changes)
        ids = [f"{name}={self.exported.identity(g).key}/lone{lone_multiple(g)}" for name, g in self.candidates.items()]
        return [*ids, f"max_query_rank_noise={self.bar}"]  # choices made before (or to another bar): again

    def timing(self, name: str, graph: Graph) -> chooser.Timing:
        """One query candidate, as every role's (``GraphChoice.timing``): the documents' graph's vectors of the
        noise sample taken first, and its compiled model dropped once it is timed."""
        if any(not self.same(g) for g in self.candidates.values()):
            _ = self._noise_sample  # the documents' graph's vectors, taken before its compiled model is dropped
        timing = super().timing(name, graph)
        if graph is self.documents:
            self._release_documents()
        return timing

    def same(self, graph: Graph) -> bool:
        """``graph`` computes as the documents' graph does: the same file in the same precision (``one_stream``: the
        same arithmetic, nothing to check; the check's sample costs a first run ~3.5 s)."""
        return graph.path == self.documents.path and graph.precision == self.documents.precision

    def describe(self) -> dict:
        """How queries are encoded (resolves the query graph if it is not resolved yet), with the measured choice
        where there was one."""
        info = graph_info(self.graph)
        choice = self.choice if self.given is None and self.documents is not None else None
        return {**info, "chosen": choice.to_dict()} if choice is not None else info


def _one_stream(graph: Graph) -> Graph | None:
    """``graph``'s OpenVINO model compiled as one stream over all its runner's threads (a lone query on every core;
    concurrent ones overflow onto its streams: ``OpenVinoRunner.one_stream``), where it runs several streams."""
    runner = graph.runner
    if getattr(runner, "one_stream", None) is None or runner.parallel < 2:
        return None
    return replace(graph, runner=runner.one_stream())


__all__ = ["MAX_QUERY_RANK_NOISE", "ONE_STREAM", "QUERY_THREADS", "QueryGraphs"]
