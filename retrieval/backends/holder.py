"""One exported model: what opens and finds its verified graphs and names them, for the bi-encoder and the
cross-encoder alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from retr.retrieval.artifacts import cache_home
from retr.retrieval.backends.export import Calibration, GraphKind
from retr.retrieval.backends.graphs import Graph, GraphId, find_cached, open_graph
from retr.retrieval.backends.registry import Backend, get_backend
from retr.retrieval.models import ModelRef


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


__all__ = ["ExportedModel"]
