"""Typed containers for what retrieval produces and what evaluation judges.

``Run`` (ranked hits per query) and ``Qrels`` (graded judgements per query) are the only shapes
passed between stages. Nested ``dict`` s appear only at the edges (BEIR / pytrec_eval I/O, TREC
files). Both are immutable once built: evaluation can never mutate its inputs.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

from retr.retrieval.errors import RetrError


class Hit(NamedTuple):
    doc_id: str
    score: float


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str
    metadata: Mapping[str, object] = field(default_factory=dict)  # a record's other fields

    def matches(self, conditions: Mapping[str, str]) -> bool:
        """Whether every ``field: value`` of ``conditions`` holds (values compared as ``filter_value`` writes them)."""
        return all(k in self.metadata and filter_value(self.metadata[k]) == v for k, v in conditions.items())

    def full_text(self) -> str:
        """Title and body as BEIR's dense and BM25 baselines see them (``title + " " + text``)."""
        if self.title:
            return f"{self.title} {self.text}".strip()
        return self.text.strip()


_SCORE_THEN_ID = operator.itemgetter(1, 0)


def trec_sorted(hits: Iterable[Hit]) -> list[Hit]:
    """trec_eval's order: score descending, ties broken by doc id descending (strcmp order)."""
    return sorted(hits, key=_SCORE_THEN_ID, reverse=True)


class Run(Mapping[str, tuple[Hit, ...]]):
    """Ranked hits per query id. Each ranking is a tuple of ``Hit`` in rank order.

    Rankings are kept in trec_eval's order (score descending, ties by doc id descending), so the
    rank a user sees, the rank in a TREC file and the rank trec_eval judges are one and the same.
    """

    __slots__ = ("_data",)

    def __init__(self, rankings: Mapping[str, Iterable[Hit | tuple[str, float]]] | None = None):
        data: dict[str, tuple[Hit, ...]] = {}
        for qid, hits in (rankings or {}).items():
            ranking = tuple(trec_sorted(h if type(h) is Hit else Hit(str(h[0]), float(h[1])) for h in hits))
            seen = {h.doc_id for h in ranking}
            if len(seen) != len(ranking):
                raise RetrError(f"run for query {qid!r} lists a document twice")
            data[str(qid)] = ranking
        self._data = MappingProxyType(data)

    def __getitem__(self, qid: str) -> tuple[Hit, ...]:
        return self._data[qid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Run({len(self)} queries)"

    def top(self, k: int) -> Run:
        return Run({q: hits[:k] for q, hits in self._data.items()})

    def without_identical_ids(self) -> Run:
        """Drop hits whose doc id equals the query id (BEIR's ArguAna/Quora convention)."""
        return Run({q: [h for h in hits if h.doc_id != q] for q, hits in self._data.items()})

    # -- edges -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, dict[str, float]]:
        return {q: {h.doc_id: h.score for h in hits} for q, hits in self._data.items()}

    @classmethod
    def from_dict(cls, results: Mapping[str, Mapping[str, float]]) -> Run:
        return cls({q: docs.items() for q, docs in results.items()})


class Qrels(Mapping[str, Mapping[str, int]]):
    """Graded relevance judgements: query id -> {doc id -> grade}. Grades > 0 are relevant."""

    __slots__ = ("_data",)

    def __init__(self, judgements: Mapping[str, Mapping[str, int]] | None = None):
        self._data = MappingProxyType(
            {str(q): MappingProxyType({str(d): int(g) for d, g in docs.items()})
             for q, docs in (judgements or {}).items()}
        )

    def __getitem__(self, qid: str) -> Mapping[str, int]:
        return self._data[qid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Qrels({len(self)} queries, {sum(len(v) for v in self._data.values())} judgements)"

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {q: dict(docs) for q, docs in self._data.items()}

    def num_relevant(self, qid: str) -> int:
        return sum(1 for g in self._data.get(qid, {}).values() if g > 0)

    def digest(self) -> str:
        """sha256 of the judgements (in no particular order): what two reports were scored against is the same
        exactly where their digests are."""
        import hashlib
        import json

        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def shown(value: object) -> str:
    """``value`` and its type, for a one-line message: ``'10' (type str)`` (the text cut to 40 characters)."""
    text = repr(value)
    return f"{text if len(text) <= 40 else text[:37] + '...'} (type {type(value).__name__})"


def check_int(value: object, field: str, least: int = 1, most: int | None = None) -> int:
    """``value`` as a bounded integer option: an ``int`` (or a NumPy integer), never a bool, a float or a string;
    a one-line ``RetrError`` naming ``field`` otherwise."""
    import numbers

    span = f"from {least} to {most}" if most is not None else f">= {least}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise RetrError(f"{field} must be a whole number {span}, got {shown(value)}")
    if int(value) < least or (most is not None and int(value) > most):
        raise RetrError(f"{field} must be {span}, got {int(value)}")
    return int(value)


def check_float(value: object, field: str, least: float, most: float, open_low: bool = False,
                open_high: bool = False) -> float:
    """``value`` as a bounded real-number setting (finite: never NaN, inf, or 1e308 where the bound is far lower);
    ``open_low``/``open_high``: the bound itself excluded. A one-line ``RetrError`` naming ``field`` otherwise."""
    import math
    import numbers

    span = f"{'(' if open_low else '['}{least:g}, {most:g}{')' if open_high else ']'}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise RetrError(f"{field} must be a finite number in {span}, got {shown(value)}")
    v = float(value)
    if v < least or v > most or (open_low and v == least) or (open_high and v == most):
        raise RetrError(f"{field} must be in {span}, got {v:g}")
    return v


def check_choice(value: object, field: str, allowed: Iterable[str], optional: bool = False) -> str | None:
    """``value`` as one of ``allowed`` (a ``str``), or None where ``optional``; a one-line ``RetrError`` naming
    ``field`` and the choices otherwise."""
    if value is None and optional:
        return None
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise RetrError(f"{field} must be one of {', '.join(allowed)}{' or None' if optional else ''}, "
                        f"got {shown(value)}")
    return value


def has_searchable_text(text: str) -> bool:
    """Whether ``text`` holds a character a retriever can match: a letter, digit, mark, symbol or punctuation.
    Whitespace, NUL and other control characters, zero-width and other format characters, surrogates and
    unassigned code points alone make no query (they would rank documents arbitrarily)."""
    import unicodedata

    return any(unicodedata.category(c)[0] in "LNMSP" for c in text)


def filter_value(value: object) -> str:
    """A metadata value as a filter compares it: strings as they are, anything else as JSON (``true``, ``3``)."""
    import json

    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)


def check_path(value: object, field: str, optional: bool = False) -> Path | None:
    """A path option (a ``str`` or ``os.PathLike``, not empty); None where ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise RetrError(f"{field} must be a path (a str or pathlib.Path){' or None' if optional else ''}, "
                        f"got {shown(value)}")
    return Path(value)


def check_text(value: object, field: str) -> str | None:
    """An optional text option (a field name, a prompt, a model name): a ``str`` or None."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if value is not None and (not isinstance(value, str) or "\0" in value):
        raise RetrError(f"{field} must be a str or None, got {shown(value)}")
    return value


def check_flag(value: object, field: str) -> bool:
    """A ``bool`` option: True or False, nothing truthy in their place."""
    if not isinstance(value, bool):
        raise RetrError(f"{field} must be True or False, got {shown(value)}")
    return value


def check_names(value: object, field: str) -> list[str]:
    """A list of names (ids, pipelines): a list or tuple of ``str``, never one ``str`` taken letter by letter."""
    if isinstance(value, (str, bytes, bytearray, Mapping, set, frozenset)) or not isinstance(value, Iterable):
        hint = f": for one, pass [{value!r}]" if isinstance(value, str) and len(value) <= 40 else ""
        raise RetrError(f"{field} must be a list of str, got {shown(value)}{hint}")
    names = list(value)
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise RetrError(f"{field}[{i}] must be a str, got {shown(name)}")
    return names
