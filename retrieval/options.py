"""Every search option declared once (``OPTIONS``): its name, type, bounds, default, help and the doors that take it.

From this table come the options of the CLI commands in its ``doors`` (``retr.cli.options.add_search_options``),
the API's signatures and keyword check (``with_options``, ``check_keywords``: an unknown keyword is a one-line error
naming the nearest), the HTTP body of `retr serve` (``retr.serve.body.http_model``) and so the CLI reference and the OpenAPI
schema; ``SearchRequest`` checks each value with its declaration (``Declared.check``). How to add an option:
docs/architecture.md. Nothing heavy is imported (`import retr` reads it); choices are read when first needed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from retr.retrieval import defaults
from retr.retrieval.errors import RetrError

MAX_K = 10_000  # more hits than any page or run file needs; FAISS and the fusion allocate k per query
MAX_FILTER_FIELDS = 64
# the CLI commands that take search options, the Python API, the service
DOORS = ("search", "eval", "serve", "check-reranker", "api", "http")


@dataclass(frozen=True)
class Declared:
    """One option and the ``doors`` that take it (of ``DOORS``). ``kind``: its type at the API (``int``, ``str``, ``dict`` for a filter); ``default``: the
    API's and the service's, None where a search takes the searcher's own setting, whose default is ``inherits``
    (the CLI's default, which opens the searcher); ``low``/``high``: inclusive bounds of a number, of a text's
    length, of a mapping's size; ``choices``: ``"module:NAME"`` of the values allowed; ``flag``/``metavar``: the
    CLI's spelling where it is not ``--name``; ``http``: the type over HTTP where it differs (``rerank``: the
    server's own cross-encoder, on or off); ``positional``: the API takes it by position after the query."""

    name: str
    kind: type
    default: object
    help: str
    doors: tuple[str, ...]
    low: int | None = None
    high: int | None = None
    choices: str = ""
    flag: str = ""
    metavar: str | None = None
    inherits: object = None
    http: type | None = None
    positional: bool = False

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def allowed(self) -> tuple[str, ...]:
        import importlib

        module, _, name = self.choices.partition(":")
        return tuple(getattr(importlib.import_module(module), name))

    def check(self, value: object, optional: bool | None = None) -> object:
        """``value`` checked against the declaration's type, bounds and choices (None allowed where ``optional``,
        by default where the default is None); a one-line ``RetrError`` naming the option otherwise."""
        import os

        from retr.retrieval.types import check_choice, check_int, shown

        optional = self.default is None if optional is None else optional
        if value is None and optional:
            return None
        if self.choices:
            return check_choice(value, self.name, self.allowed(), optional=optional)
        if self.kind is int:
            return check_int(value, self.name, self.low if self.low is not None else 1, self.high)
        value = os.fspath(value) if self.kind is str and isinstance(value, os.PathLike) else value
        if self.kind is str and (not isinstance(value, str) or not value.strip()):
            raise RetrError(f"{self.name} must be a non-empty str ({self.metavar}) or None, got {shown(value)}")
        return value


OPTIONS: tuple[Declared, ...] = (
    Declared("k", int, defaults.K, "hits to return", ("search", "api", "http"), low=1, high=MAX_K, flag="-k",
             positional=True),
    Declared("mode", str, defaults.MODE,
             "one pipeline: bm25, dense, hybrid (= fuse(bm25,dense)), or an expression such as bm25+rm3, "
             "fuse(bm25,bm25+rm3,dense) or hybrid+rerank (docs/guides/search.md); a given cross-encoder adds "
             "+rerank to one without it", ("search", "api", "http"), low=1, high=400, metavar="PIPELINE",
             positional=True),
    Declared("rerank", str, None,
             "the cross-encoder folder of the +rerank stage: it rescores the first stage's top --rerank-depth hits "
             "(default: none; over HTTP: true or false, the server's own --rerank)",
             ("search", "eval", "serve", "api", "http"), metavar="MODEL_DIR", http=bool, positional=True),
    Declared("filter", dict, None,
             "only documents whose record has FIELD equal to VALUE (repeat: all must hold; default: every "
             "document)", ("search", "api", "http"), high=MAX_FILTER_FIELDS, metavar="FIELD=VALUE", positional=True),
    Declared("fusion", str, None,
             "hybrid: how the BM25 and dense rankings are fused (minmax, zscore: normalised scores summed; rrf: "
             "reciprocal rank fusion)", DOORS, choices="retr.retrieval.fusion:FUSIONS", inherits=defaults.FUSION),
    Declared("fusion_depth", int, None,
             "hybrid: the top hits of BM25 and of dense whose scores set each list's normalisation (each list is "
             "still searched to k where k is larger)", DOORS, low=1, high=MAX_K, inherits=defaults.FUSION_DEPTH),
    Declared("passage_aggregate", str, None,
             "an index of passages: a document's score from its passages' (maxp: the best; default: the "
             "index's own)", DOORS, choices="retr.retrieval.passages:AGGREGATES"),
)
BY_NAME = {o.name: o for o in OPTIONS}


def at(door: str) -> tuple[Declared, ...]:
    """The options a door takes, in the table's order."""
    return tuple(o for o in OPTIONS if door in o.doors)


def checked(**values) -> dict:
    """``values`` each checked with its declaration, None refused: the searcher's own settings (``Index.load``'s
    and ``evaluate``'s fusion and fusion depth)."""
    return {name: BY_NAME[name].check(value, optional=False) for name, value in values.items()}


def check_keywords(given: Mapping[str, object], door: str = "api") -> None:
    """A one-line ``RetrError`` for the first keyword of ``given`` that ``door`` does not take, naming the
    nearest one it does."""
    import difflib

    names = [o.name for o in at(door)]
    unknown = sorted(set(given) - set(names))
    if unknown:
        near = difflib.get_close_matches(unknown[0], names, n=1, cutoff=0.5)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise RetrError(f"unknown search option {unknown[0]!r}: {hint}the options are {', '.join(names)}")


def with_options(fn: Callable) -> Callable:
    """``fn(self, ..., **options)`` shown and called with the API's options: its signature lists them with their
    defaults (``help()``, ``inspect.signature``), the positional ones may be given by position after ``fn``'s own
    arguments, and an unknown keyword is ``check_keywords``' error."""
    import functools
    import inspect

    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    options = sorted(at("api"), key=lambda o: not o.positional)
    shown = sig.replace(parameters=own + [inspect.Parameter(o.name, inspect.Parameter.POSITIONAL_OR_KEYWORD if
                                                            o.positional else inspect.Parameter.KEYWORD_ONLY,
                                                            default=o.default) for o in options])

    @functools.wraps(fn)
    def call(*args, **kwargs):
        check_keywords({k: v for k, v in kwargs.items() if k not in sig.parameters})
        return fn(**shown.bind(*args, **kwargs).arguments)  # Python's own errors for too many or twice given

    call.__signature__ = shown
    return call
