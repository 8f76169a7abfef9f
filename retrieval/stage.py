"""What a pipeline stage declares (``Stage``) and what its builder is handed (``Context``).

A stage is one module holding its retriever and a ``STAGE`` declaration; ``retr.retrieval.stages`` lists the
declarations (the one registry). The pipeline value (``retr.retrieval.pipeline``) checks names, arity and options
against the declaration; the builder (``retr.retrieval.compose``) calls ``Stage.build`` with a ``Context``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from retr.retrieval.errors import RetrError
from retr.retrieval.protocol import Retriever

KINDS = ("source", "step", "combine")  # a first stage; a stage after one (`+name`); a stage over several (`name(a,b)`)


@dataclass(frozen=True)
class Option:
    """One option of a stage: its default (its type is the default's, or ``kind`` where the default is None),
    inclusive bounds for numbers, choices for text."""

    default: object
    kind: type = float
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    def check(self, stage: str, name: str, value: object) -> object:
        where = f"{stage}: option {name}"
        if self.choices:
            if value not in self.choices:
                raise RetrError(f"{where} is {value!r}: choose one of {', '.join(self.choices)}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise RetrError(f"{where} must be a number, got {value!r}")
        if self.kind is int:
            if value != int(value):
                raise RetrError(f"{where} must be a whole number, got {value!r}")
            value = int(value)
        else:
            value = float(value)
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise RetrError(f"{where} is {value!r}: it must lie in [{self.low}, {self.high if self.high is not None else '∞'}]")
        return value


@dataclass(frozen=True)
class Context:
    """What a stage's builder reads: the index's shared parts (``retr.retrieval.compose.IndexParts``), the
    pipeline options of this search (``PipelineConfig``), the cross-encoder of a ``rerank`` stage (None: none
    given) and the document positions a filter allows (None: all)."""

    parts: object
    config: object
    reranker: object | None = None
    allowed: object | None = None


@dataclass(frozen=True)
class Stage:
    """A stage as the registry declares it.

    ``build(context, node, inputs) -> Retriever``: ``node`` is the ``Pipeline`` value being built (its
    ``options`` mapping and its text form ``str(node)``), ``inputs`` the retrievers of its inputs (none for a
    source, one for a step, several for a combine). ``needs``: the index parts it reads (``dense``, ``bm25``) and
    ``rerank`` where it needs a cross-encoder; ``stages``: the names it times on a ``StageTimer``."""

    name: str
    kind: str
    build: Callable[[Context, object, Sequence[Retriever]], Retriever]
    help: str
    needs: tuple[str, ...] = ()
    options: Mapping[str, Option] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"stage {self.name}: kind {self.kind!r} is not one of {KINDS}")
