"""A pipeline is a value: stages composed into a tree, immutable and hashable, with a small text form.

Text form (``parse``), the names of the stage registry (``retr.retrieval.stages``)::

    bm25 | dense                       a first stage (a source)
    fuse(bm25,dense,...)               a fusion of any number of lists (``method=rrf|minmax|zscore``: else the
                                       searcher's fusion); ``hybrid`` is ``fuse(bm25,dense)``
    X+rerank | X+rm3 | X+rm3(fb_terms=20)
                                       a step over pipeline X (options by name)
    X%100                              X cut to its top 100
    (X)                                grouping

``parse`` is called once where a pipeline enters (the CLI, the API, the service); the value then travels. The
Python API composes the same values: ``BM25() >> RM3() >> Rerank()``, ``Fuse(BM25(), Dense())``, ``X % 100``
(``retr.stages``). ``str(value)`` is the canonical text (``hybrid`` for ``fuse(bm25,dense)``), the name a report
keys its rows by; parsing it gives the value back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from retr.retrieval import defaults
from retr.retrieval.errors import RetrError
from retr.retrieval.fusion import DEFAULT_FUSION, FUSIONS
from retr.retrieval.passages import AGGREGATES
from retr.retrieval.stage import Stage
from retr.retrieval.stages import ALIASES, STAGES

FIRST_STAGES = ("bm25", "dense", "hybrid")  # the pipelines the service's page offers; any expression is accepted


def _declared(name: str) -> Stage:
    if name not in STAGES:
        raise RetrError(f"unknown stage {name!r}: choose from {', '.join([*STAGES, *ALIASES])} (e.g. hybrid, "
                        f"bm25+rerank, fuse(bm25,dense))")
    return STAGES[name]


def _shown(value: object) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


class Pipeline:
    """A stage (``stage``: a registry name) over ``inputs`` (other pipelines: none for a first stage, one for a
    step, several for a fusion), with ``options`` (a sorted tuple of (name, value), defaults left out). A step
    with no input is pending: ``>>`` applies it to a pipeline."""

    __slots__ = ("stage", "inputs", "options")

    def __init__(self, stage: str, inputs: Iterable[Pipeline] = (), options: Mapping[str, object] | None = None):
        decl = _declared(stage)
        inputs = tuple(inputs)
        if any(not isinstance(p, Pipeline) or p.pending for p in inputs):
            raise RetrError(f"{stage}: its inputs must be pipelines, e.g. {stage}(bm25,dense)")
        if decl.kind == "source" and inputs:
            raise RetrError(f"{stage} is a first stage: it takes no input")
        if decl.kind == "step" and len(inputs) > 1:
            raise RetrError(f"{stage} is applied to one pipeline, e.g. bm25+{stage}")
        if decl.kind == "combine" and len(inputs) < 2:
            raise RetrError(f"{stage} combines two or more pipelines, e.g. {stage}(bm25,dense)")
        checked = {}
        for name, value in (options or {}).items():
            if name not in decl.options:
                raise RetrError(f"{stage}: unknown option {name!r}"
                                + (f": choose from {', '.join(decl.options)}" if decl.options else ": it takes none"))
            value = decl.options[name].check(stage, name, value)
            if value != decl.options[name].default:
                checked[name] = value
        object.__setattr__(self, "stage", stage)
        object.__setattr__(self, "inputs", inputs)
        object.__setattr__(self, "options", tuple(sorted(checked.items())))

    def __setattr__(self, name, value):
        raise AttributeError("a Pipeline is immutable: compose a new one")

    def __reduce__(self):
        return Pipeline, (self.stage, self.inputs, dict(self.options))

    @property
    def declaration(self) -> Stage:
        return STAGES[self.stage]

    @property
    def pending(self) -> bool:
        """A step not yet applied to a pipeline (``RM3()`` before ``>>``)."""
        return self.declaration.kind == "step" and not self.inputs

    def option(self, name: str) -> object:
        """This node's value of option ``name`` (its declared default where not given)."""
        return dict(self.options).get(name, self.declaration.options[name].default)

    def nodes(self) -> Iterator[Pipeline]:
        """This node and every node under it, depth first."""
        yield self
        for p in self.inputs:
            yield from p.nodes()

    @property
    def needs(self) -> frozenset[str]:
        """The index parts (``dense``, ``bm25``) and models (``rerank``) running it reads."""
        return frozenset(n for node in self.nodes() for n in node.declaration.needs)

    @property
    def reranks(self) -> bool:
        return "rerank" in self.needs

    @property
    def name(self) -> str:
        return str(self)

    def _key(self) -> tuple:
        return self.stage, self.inputs, self.options

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pipeline) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Pipeline({str(self)!r})"

    def __str__(self) -> str:
        kind = self.declaration.kind
        opts = [f"{k}={_shown(v)}" for k, v in self.options]
        if kind == "source":
            return self.stage + (f"({','.join(opts)})" if opts else "")
        if kind == "combine":
            parts = [str(p) for p in self.inputs]
            for alias, value in ALIASES.items():
                if self.stage == value[0] and parts == list(value[1]) and not opts:
                    return alias
            return f"{self.stage}({','.join(parts + opts)})"
        inner = str(self.inputs[0]) if self.inputs else ""
        if self.stage == "cut":
            return f"{inner}%{self.option('depth')}"
        return f"{inner}+{self.stage}" + (f"({','.join(opts)})" if opts else "")

    def __rshift__(self, step: Pipeline) -> Pipeline:
        """``self >> step``: the pending step ``step`` (``Rerank()``, ``RM3()``) applied to this pipeline."""
        if not isinstance(step, Pipeline) or not step.pending:
            raise RetrError(f"{self} >> {step!r}: the right side must be a step such as RM3() or Rerank()")
        return Pipeline(step.stage, (self,), dict(step.options))

    def __mod__(self, depth: int) -> Pipeline:
        """``self % n``: this pipeline's top ``n`` hits only."""
        return Pipeline("cut", (self,), {"depth": depth})


@dataclass(frozen=True)
class PipelineConfig:
    """The options of a search a pipeline value leaves open: the fusion of a ``fuse`` that names none, the depth
    whose scores set each fused list's normalisation, RRF's k, and (an index of passages) the passage aggregate."""

    fusion: str = DEFAULT_FUSION
    fusion_depth: int = defaults.FUSION_DEPTH
    rrf_k: int = 60
    passage_aggregate: str | None = None  # an index of passages: None takes the one it was built with
    sparse_engine: str = "exact"  # how a splade stage searches: exact (CSR dot products) | seismic (approximate)
    multivector_model: str | None = None  # a maxsim stage's MultiVectorEncoder (a folder or hub id)

    def __post_init__(self) -> None:
        if self.sparse_engine not in ("exact", "seismic"):  # retr.retrieval.sparse.ENGINES
            raise RetrError(f"unknown sparse engine {self.sparse_engine!r}: choose one of exact, seismic")
        if self.fusion not in FUSIONS:
            raise RetrError(f"unknown fusion {self.fusion!r}: choose one of {', '.join(FUSIONS)}")
        if self.passage_aggregate is not None and self.passage_aggregate not in AGGREGATES:
            raise RetrError(f"unknown passage aggregate {self.passage_aggregate!r}: choose one of "
                            f"{', '.join(AGGREGATES)}")


# -- the text form ---------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
                    r"|(?P<op>[()+%,=]))")


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, 1-based column)
        at = 0
        while at < len(text):
            m = _TOKEN.match(text, at)
            if m is None:
                rest = text[at:]
                if not rest.strip():
                    break
                column = at + 1 + len(rest) - len(rest.lstrip())
                self.fail(f"unexpected character {text[column - 1]!r}", column)
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind), m.start(kind) + 1))
            at = m.end()
        self.i = 0

    def fail(self, what: str, column: int | None = None):
        column = column if column is not None else self._column()
        raise RetrError(f"pipeline {self.text!r}, position {column}: {what}")

    def _column(self) -> int:
        return self.tokens[self.i][2] if self.i < len(self.tokens) else len(self.text.rstrip()) + 1

    def peek(self, value: str | None = None, kind: str | None = None) -> bool:
        if self.i >= len(self.tokens):
            return False
        k, v, _ = self.tokens[self.i]
        return (value is None or v == value) and (kind is None or k == kind)

    def take(self, value: str | None = None, kind: str | None = None, what: str = "") -> str:
        if not self.peek(value, kind):
            found = f"{self.tokens[self.i][1]!r}" if self.i < len(self.tokens) else "the end"
            self.fail(f"expected {what or repr(value)}, found {found}")
        self.i += 1
        return self.tokens[self.i - 1][1]

    def done(self) -> bool:
        return self.i >= len(self.tokens)

    def pipelines(self) -> list[Pipeline]:
        found = [self.expr()]
        self.commas: list[int] = []  # the columns of the commas between pipelines (none inside parentheses)
        while self.peek(","):
            self.commas.append(self._column())
            self.take(",")
            found.append(self.expr())
        if not self.done():
            self.fail(f"unexpected {self.tokens[self.i][1]!r}")
        return found

    def expr(self) -> Pipeline:
        node = self.term()
        while self.peek("+") or self.peek("%"):
            if self.take() == "%":
                column = self._column()
                depth = self.take(kind="num", what="a number of hits after %")
                node = self._made("cut", (node,), {"depth": float(depth) if "." in depth else int(depth)}, column)
                continue
            column = self._column()
            name = self.take(kind="name", what="a stage name after +")
            if name in STAGES and STAGES[name].kind != "step" or name in ALIASES:
                self.fail(f"{name} is not a step (a step follows +: {', '.join(self._steps())}); to combine "
                          f"pipelines use fuse(...)", column)
            inputs, options = self.args(name, column)
            node = self._made(name, (node, *inputs), options, column)
        return node

    def term(self) -> Pipeline:
        if self.peek("("):
            self.take("(")
            node = self.expr()
            self.take(")", what="')'")
            return node
        column = self._column()
        name = self.take(kind="name", what="a stage name")
        if name in ALIASES:
            stage, parts = ALIASES[name]
            return Pipeline(stage, [Pipeline(p) for p in parts])
        if name in STAGES and STAGES[name].kind == "step":
            self.fail(f"{name} is a step: it follows a pipeline, e.g. bm25+{name}", column)
        inputs, options = self.args(name, column)
        return self._made(name, inputs, options, column)

    def args(self, name: str, column: int) -> tuple[list[Pipeline], dict]:
        inputs, options = [], {}
        if not self.peek("("):
            return inputs, options
        self.take("(")
        while not self.peek(")"):
            if self.peek(kind="name") and self.i + 1 < len(self.tokens) and self.tokens[self.i + 1][1] == "=":
                key = self.take()
                self.take("=")
                kind, value, _ = self.tokens[self.i] if self.i < len(self.tokens) else ("", "", 0)
                if kind not in ("num", "name"):
                    self.fail(f"expected a value for {key}")
                self.i += 1
                options[key] = value if kind == "name" else (float(value) if re.search(r"[.eE]", value)
                                                             else int(value))
            else:
                inputs.append(self.expr())
            if not self.peek(")"):
                self.take(",", what="',' or ')'")
        self.take(")")
        return inputs, options

    def _made(self, name: str, inputs, options, column: int) -> Pipeline:
        try:
            return Pipeline(name, inputs, options)
        except RetrError as e:
            self.fail(str(e), column)

    @staticmethod
    def _steps() -> list[str]:
        return [n for n, s in STAGES.items() if s.kind == "step"]


def parse(text: str | Pipeline) -> Pipeline:
    """One pipeline from its text form (a ``Pipeline`` is returned as it is); a bad expression is a one-line
    ``RetrError`` naming the position."""
    if isinstance(text, Pipeline):
        if text.pending:
            raise RetrError(f"{text!r} is a step with nothing to apply it to: write e.g. BM25() >> {text.stage}")
        return text
    if not isinstance(text, str):
        raise RetrError(f"a pipeline is a str such as 'hybrid' or a retr.stages value, got {type(text).__name__}")
    parser = _Parser(text)
    if parser.done():
        raise RetrError(f"no pipeline given: write e.g. {', '.join(FIRST_STAGES)}, bm25+rm3 or fuse(bm25,dense)")
    found = parser.pipelines()
    if len(found) > 1:
        parser.fail("one pipeline expected, found a list (a comma outside parentheses)", parser.commas[0])
    return found[0]


def parse_pipelines(spec: str | Iterable[str | Pipeline]) -> tuple[Pipeline, ...]:
    """``"bm25,bm25+rm3,fuse(bm25,dense)"`` (commas inside parentheses belong to their expression), or a sequence
    of expressions / values -> pipelines, duplicates dropped, order kept."""
    if isinstance(spec, str):
        parser = _Parser(spec)
        if parser.done():
            raise RetrError(f"no pipeline given: write e.g. {','.join(FIRST_STAGES)}")
        found = parser.pipelines()
    else:
        found = [parse(p) for p in spec]
        if not found:
            raise RetrError(f"no pipeline given: write e.g. {','.join(FIRST_STAGES)}")
    return tuple(dict.fromkeys(found))
