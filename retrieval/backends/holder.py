"""One exported model: what opens and finds its verified graphs and names them, and the measured choice among
them of one role (``GraphChoice``: a bi-encoder's queries, a cross-encoder's pairs)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from retr.retrieval.artifacts import cache_home
from retr.retrieval.backends import chooser, registry
from retr.retrieval.backends.export import Calibration, GraphKind
from retr.retrieval.backends.graphs import Graph, GraphId, find_cached, open_graph
from retr.retrieval.backends.registry import Backend, get_backend
from retr.retrieval.errors import RetrError
from retr.retrieval.models import ModelRef

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportedModel:
    """A model whose graphs of one ``kind`` (``EMBEDDING`` or ``SCORING``) live in retr's graph cache
    (``$RETR_CACHE``, read at each call). ``load`` returns its torch model, called only where a graph must be
    exported; ``use_cache_alone``: whether a cached graph is enough (False where the caller loads the torch model
    anyway, having no ``tokenizer.json``: ``graphs.open_graph``)."""
    ref: ModelRef
    kind: GraphKind
    max_length: int
    load: Callable[[], object]
    use_cache_alone: bool = True

    @property
    def model_hash(self) -> str:
        return self.ref.hash

    def open(self, backend: str, calibration: Calibration | None = None, threads: int | None = None,
             base: Graph | None = None) -> Graph | None:
        """``graphs.open_graph``: the verified graph for ``backend``, from the cache or made now (built from the
        weights where it can be, else exported from ``load()``; an int8 graph made from ``base``, this model's
        base graph, and checked against it, where given and it computes in fp32); None where torch runs."""
        return open_graph(self.load, self.ref.hash, backend, self.max_length, cache_home(), self.kind,
                          use_cache_alone=self.use_cache_alone, calibration=calibration, threads=threads,
                          model_path=self.ref.path, base=base)

    def find(self, backend: Backend | str, calibration: Calibration | None = None,
             threads: int | None = None) -> Graph | None:
        """``graphs.find_cached``: the cached, verified graph for ``backend``, or None; nothing is made."""
        if isinstance(backend, str):
            backend = get_backend(backend, self.kind)
        return find_cached(self.ref.hash, backend, self.kind, cache_home(), threads=threads, calibration=calibration)

    def identity(self, graph: Graph | None) -> GraphId:
        """What names ``graph`` of this model in cache keys and stored choices (None: torch)."""
        return graph.identity(self.ref.hash) if graph is not None else GraphId(self.ref.hash, "torch", None)


    def cached(self, reference: Graph, platform, calibration: Callable[[], Calibration] | None,
               offered: Callable[[Backend], bool] = lambda b: True,
               threads: Callable[[Backend], int | None] = lambda b: None) -> list[tuple[Backend, Graph]]:
        """Every other graph of this model's kind than ``reference`` that is ``offered``, can run on ``platform``
        (``chooser.prune``) and is in the cache (verified when it was made; nothing is made now), with its backend;
        a calibrated one where there is a ``calibration``. One refused here before is no candidate."""
        kept, _ = chooser.prune(platform, [b for name, b in registry.BACKENDS.items() if name != reference.variant
                                           and b.exported and b.supports(self.kind) and offered(b)
                                           and (not b.calibrated or calibration is not None)])
        found = []
        for b in kept:
            try:
                graph = self.find(b, calibration() if b.calibrated else None, threads=threads(b))
            except RetrError as e:  # refused here before: not a candidate
                logger.debug("%s candidate %s not used: %s", self.kind.label, b.name, e)
                continue
            if graph is not None:
                found.append((b, graph))
        return found


class GraphChoice:
    """One role's candidate graphs of a model (``candidates``: name -> graph, ``reference`` first: the fallback, and
    what the others' ranking noise is measured against) and the one chooser's choice among them
    (``chooser.decide``: stored, else each candidate timed (``seconds``) and checked (``noise``, held to ``bar``)).
    A role gives ``exported``, ``platform``, ``reference``, ``candidates``, ``seconds``, ``noise`` and ``key_ids``
    (what else its stored choice is keyed by)."""
    role: str
    bar: float
    label: str

    def same(self, graph: Graph) -> bool:
        """``graph`` computes as the reference does: nothing to check."""
        return graph is self.reference

    def timing(self, name: str, graph: Graph) -> chooser.Timing:
        """One candidate, timed and (unless it computes as the reference does) checked for ranking noise."""
        return chooser.checked(name, self.seconds(graph), None if self.same(graph) else self.noise(graph), self.bar)

    def key(self) -> str:
        return chooser.choice_key(self.exported.model_hash, self.role, self.key_ids(), self.platform)

    def decide(self, again: bool = False) -> chooser.Choice:
        """The role's choice (``chooser.decide``): stored, else every candidate timed and checked now, chosen and
        stored; ``again``: timed whatever is stored (`retr doctor`)."""
        return chooser.decide(self.role, self.key(), self.candidates, self.timing, self.reference.variant,
                              model_hash=self.exported.model_hash, platform=self.platform, label=self.label,
                              again=again)


__all__ = ["ExportedModel", "GraphChoice"]
