"""One search request, built and checked the same way by every door: `retr search`, ``retr.Index.search`` /
``search_batch`` and `retr serve`'s ``POST /search``; ``Searcher.run`` takes it.

Each option's type, bounds, default and help are declared once, in ``retr.retrieval.options.OPTIONS``; this
module checks a request against them, once, so a bad value is a one-line ``RetrError`` naming the field whichever
door it came through. Beyond the declarations: ``mode`` is parsed here once (a text form such as ``hybrid``,
``bm25+rm3`` or ``fuse(bm25,dense)+rerank``, or a ``Pipeline`` value); ``filter`` is a mapping of ``str`` field ->
``str``/``int``/``float``/``bool``; queries are ``str`` s with at least one searchable character
(``has_searchable_text``), and a batch is a list or tuple of them, never a ``str``.

The default mode is **hybrid** at every door (it was ``dense`` in the CLI, ``hybrid`` in the API and the
service). Hybrid is the better ranking on every collection measured and costs little: nDCG@10 with the bundled
model (benchmarks/results/fusion-study.json, README "Fusion") SciFact test 0.7273 hybrid against 0.6456 dense
and 0.6863 BM25; the mean over the four zero-shot collections (npl, cranfield, cisi, adi) 0.4743 against 0.4338
dense and 0.4201 BM25, and hybrid is never below either part on any of them (worst gap +0.021). The extra cost is
one BM25 search and the fusion of two top-100 lists, a few ms next to the query encoding both modes pay (README
"Service": a hybrid SciFact query ~10 ms on a 2-core AMD EPYC). An index built without BM25 (`--no-bm25`) must
be searched with ``mode="dense"``; it says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from retr.retrieval import defaults
from retr.retrieval.errors import RetrError
from retr.retrieval.fusion import DEFAULT_FUSION
from retr.retrieval.options import BY_NAME, MAX_FILTER_FIELDS, MAX_K, check_keywords
from retr.retrieval.pipeline import Pipeline, parse
from retr.retrieval.types import has_searchable_text, shown

DEFAULT_MODE = defaults.MODE
DEFAULT_K = defaults.K
MAX_QUERY_CHARS = 100_000  # a whole document pasted as a query still fits; the service bounds it tighter

__all__ = ["DEFAULT_FUSION", "DEFAULT_K", "DEFAULT_MODE", "MAX_K", "SearchRequest", "check_queries",
           "check_query"]

Scalar = str | int | float | bool


def check_query(text: object, field: str = "query") -> str:
    """``text`` as a query: a ``str`` holding at least one searchable character, at most ``MAX_QUERY_CHARS``."""
    if not isinstance(text, str):
        raise RetrError(f"{field} must be a str, got {shown(text)}")
    if not has_searchable_text(text):
        raise RetrError(f"{field}: the query is empty or holds no searchable characters (only whitespace, control "
                        f"or zero-width characters): give some words to search for")
    if len(text) > MAX_QUERY_CHARS:
        raise RetrError(f"{field} is longer than {MAX_QUERY_CHARS} characters ({len(text)})")
    return text


def check_queries(values: object, field: str = "queries") -> tuple[str, ...]:
    """``values`` as a batch of queries: a list or tuple (or another ordered iterable: not a ``str``, ``bytes``,
    mapping or set) of at least one query."""
    if isinstance(values, (str, bytes, bytearray, Mapping, set, frozenset)) or not isinstance(values, Iterable):
        raise RetrError(f"{field} must be a list of str, got {shown(values)}"
                        + (": a str is one query, not a list of them" if isinstance(values, str) else ""))
    queries = tuple(values)
    if not queries:
        raise RetrError(f"{field} is empty: give at least one query")
    return tuple(check_query(q, f"{field}[{i}]") for i, q in enumerate(queries))


def _filter(value: object) -> Mapping[str, Scalar] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise RetrError(f"filter must be a mapping of field -> value (e.g. {{'lang': 'en'}}) or None, "
                        f"got {shown(value)}")
    if len(value) > MAX_FILTER_FIELDS:
        raise RetrError(f"filter has {len(value)} fields: at most {MAX_FILTER_FIELDS}")
    out: dict[str, Scalar] = {}
    for key, v in value.items():
        if not isinstance(key, str) or not key.strip():
            raise RetrError(f"filter: a field name must be a non-empty str, got {shown(key)}")
        if not isinstance(v, (str, int, float, bool)):  # bool is an int; NumPy scalars are refused alike
            raise RetrError(f"filter[{key!r}] must be a str, int, float or bool, got {shown(v)}")
        out[key] = v
    return Filter(out) if out else None


class Filter(Mapping[str, Scalar]):
    """A request's ``{field: value}`` conditions: read-only and hashable, so the request is a value."""

    __slots__ = ("_data",)

    def __init__(self, conditions: Mapping[str, Scalar]):
        self._data = MappingProxyType(dict(conditions))

    def __getitem__(self, field: str) -> Scalar:
        return self._data[field]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def _key(self) -> tuple:  # typed: 1 and True filter differently (``filter_value``), so they differ here
        return tuple(sorted((k, type(v).__name__, v) for k, v in self._data.items()))

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Filter) and self._key() == other._key()

    def __repr__(self) -> str:
        return f"Filter({dict(self._data)!r})"


@dataclass(frozen=True)
class SearchRequest:
    """What to search for and how: checked on construction, immutable after. ``queries``: one or more, each
    searched alone; the options are ``retr.retrieval.options.OPTIONS``' (None: the searcher's own setting);
    ``pipeline`` holds the mode as a value, with ``+rerank`` added where ``rerank`` names a cross-encoder and the
    mode has none. Build one with ``one`` (a single query) or ``batch``; constructing directly checks the same way.
    """

    queries: tuple[str, ...]
    k: int = DEFAULT_K
    mode: str | Pipeline = DEFAULT_MODE
    fusion: str | None = None
    rerank: str | None = None
    filter: Mapping[str, Scalar] | None = None
    passage_aggregate: str | None = None
    fusion_depth: int | None = None
    pipeline: Pipeline = field(init=False)

    def __post_init__(self) -> None:
        try:  # a value given is taken as it is: a pipeline is parsed once, at its door
            mode = parse(self.mode)
        except RetrError as e:
            raise RetrError(f"mode: {e}") from None
        rerank = BY_NAME["rerank"].check(self.rerank)
        if mode.reranks and rerank is None:
            raise RetrError(f"mode {str(mode)!r} needs a cross-encoder: give rerank (a cross-encoder folder)")
        checked = {
            "queries": check_queries(self.queries),
            **{name: BY_NAME[name].check(getattr(self, name)) for name in ("k", "fusion", "passage_aggregate",
                                                                             "fusion_depth")},
            "mode": str(mode),
            "pipeline": mode if rerank is None or mode.reranks else mode >> Pipeline("rerank"),
            "rerank": rerank,
            "filter": _filter(self.filter),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @classmethod
    def one(cls, query: object, **options) -> SearchRequest:
        """A request for one query (a ``str``; a list is refused: use ``batch``)."""
        check_keywords(options)
        return cls(queries=(check_query(query),), **options)

    @classmethod
    def batch(cls, queries: object, **options) -> SearchRequest:
        """A request for a batch of queries (a list or tuple of ``str``; a ``str`` is refused: use ``one``)."""
        check_keywords(options)
        return cls(queries=check_queries(queries), **options)

    @property
    def query(self) -> str:
        """The query of a one-query request."""
        if len(self.queries) != 1:
            raise RetrError(f"this request holds {len(self.queries)} queries, not one")
        return self.queries[0]

