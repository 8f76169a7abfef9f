"""Long documents as passages: split by the encoder's own tokens (on sentence boundaries where possible), and
passage scores folded back into document scores.

A passage index holds one vector per passage; ``PassageMap.docs[row]`` is the document (its position among the
index's rows) that vector ``row`` came from. Search asks FAISS for passages, then ranks documents by an
aggregate of their passages' scores (``AGGREGATES``): MaxP (the best passage; the default), FirstP (the first
passage only) or sum (over the passages found in the searched depth).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from retr.retrieval import defaults
from retr.retrieval.errors import RetrError

DEFAULT_AGGREGATE = defaults.AGGREGATE
AGGREGATES = ("maxp", "firstp", "sum")
SENTENCE_END = frozenset(".!?;")


@dataclass(frozen=True)
class PassageConfig:
    """Passages of ``size`` tokens (the encoder's tokens, title included, special tokens and prompt not), a new
    one starting every ``stride`` tokens (``stride == size``: no overlap)."""
    size: int = 256
    stride: int = 128
    aggregate: str = DEFAULT_AGGREGATE

    def __post_init__(self) -> None:
        if self.size < 8:
            raise RetrError(f"passages of {self.size} tokens are too short: give at least 8")
        if not 1 <= self.stride <= self.size:
            raise RetrError(f"passage stride {self.stride} must be between 1 and the passage size {self.size}")
        if self.aggregate not in AGGREGATES:
            raise RetrError(f"unknown passage aggregate {self.aggregate!r}: choose one of {', '.join(AGGREGATES)}")

    @classmethod
    def parse(cls, text: str, aggregate: str = DEFAULT_AGGREGATE) -> PassageConfig:
        """``"N"`` (stride N/2) or ``"N:STRIDE"``."""
        m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text or "")
        if not m:
            raise RetrError(f"--passages {text!r}: give N or N:STRIDE (tokens), e.g. 256:128")
        size = int(m.group(1))
        return cls(size, int(m.group(2)) if m.group(2) else max(1, size // 2), aggregate)


@dataclass(frozen=True)
class Passages:
    """What splitting a corpus gave: each passage's text, its document and its span in that document's body."""
    texts: list[str]
    docs: np.ndarray  # (p,) int32: the document of each passage
    spans: np.ndarray  # (p, 2) int64: character start and end in the document's body


def passage_text(title: str, piece: str) -> str:
    """A passage as it is encoded and reranked: its document's title, then its piece of the body."""
    return f"{title} {piece}".strip() if title else piece


def _sentence_starts(body: str, offsets: Sequence[tuple[int, int]]) -> np.ndarray:
    """Token positions where a sentence (or a line) begins: after a token ending in . ! ? ; or a line break."""
    starts = [0]
    for i in range(1, len(offsets)):
        prev_end, start = offsets[i - 1][1], offsets[i][0]
        gap = body[prev_end:start]
        if "\n" in gap or (gap and body[prev_end - 1] in SENTENCE_END):
            starts.append(i)
    return np.asarray(starts, dtype=np.int64)


def windows(n_tokens: int, starts: np.ndarray, size: int, stride: int) -> list[tuple[int, int]]:
    """``[start, end)`` token windows of at most ``size`` covering ``n_tokens``, a new one every ~``stride``;
    each end and each next start moves back to a sentence start when one lies in the window's second half."""
    if n_tokens <= size:
        return [(0, n_tokens)]
    out = []
    start = 0
    while True:
        hard_end = start + size
        if hard_end >= n_tokens:
            out.append((start, n_tokens))
            return out
        end = _snap(starts, start + size // 2, hard_end) or hard_end
        out.append((start, end))
        nxt = min(_snap(starts, start + stride // 2, start + stride) or start + stride, end)
        start = nxt if nxt > start else end


def _snap(starts: np.ndarray, low: int, high: int) -> int | None:
    """The last sentence start in ``(low, high]``, or None."""
    i = int(np.searchsorted(starts, high, side="right")) - 1
    return int(starts[i]) if i >= 0 and starts[i] > low else None


def split_passages(titles: Sequence[str], bodies: Sequence[str], cfg: PassageConfig,
                   offsets_of: Callable[[list[str]], list[list[tuple[int, int]]]],
                   count_tokens: Callable[[list[str]], list[int]], chunk: int = 256) -> Passages:
    """Every document's passages. ``offsets_of``: texts -> each text's token character offsets (no special
    tokens); ``count_tokens``: texts -> token counts. Each passage is ``title + " " + piece of the body``, with
    the title's tokens taken from the passage's budget (it keeps at least half of it); a document with an
    empty body is one passage, its title."""
    texts: list[str] = []
    docs: list[int] = []
    spans: list[tuple[int, int]] = []
    for lo in range(0, len(bodies), chunk):
        part_bodies = list(bodies[lo:lo + chunk])
        part_titles = list(titles[lo:lo + chunk])
        title_tokens = count_tokens([t for t in part_titles])
        for j, (title, body, offsets) in enumerate(zip(part_titles, part_bodies, offsets_of(part_bodies),
                                                       strict=True)):
            budget = max(cfg.size - (title_tokens[j] if title else 0), cfg.size // 2)
            stride = max(1, min(cfg.stride, budget))
            if not offsets:
                texts.append(title.strip())
                docs.append(lo + j)
                spans.append((0, len(body)))
                continue
            starts = _sentence_starts(body, offsets)
            for a, b in windows(len(offsets), starts, budget, stride):
                c0, c1 = offsets[a][0], offsets[b - 1][1]
                texts.append(passage_text(title, body[c0:c1]))
                docs.append(lo + j)
                spans.append((c0, c1))
    return Passages(texts, np.asarray(docs, dtype=np.int32), np.asarray(spans, dtype=np.int64).reshape(-1, 2))


class PassageMap:
    """Which document each vector row of a passage index belongs to, and how their scores make a document's."""

    def __init__(self, docs: np.ndarray, spans: np.ndarray | None, aggregate: str = DEFAULT_AGGREGATE,
                 num_docs: int | None = None):
        if aggregate not in AGGREGATES:
            raise RetrError(f"unknown passage aggregate {aggregate!r}: choose one of {', '.join(AGGREGATES)}")
        self.docs = docs
        self.spans = spans
        self.aggregate = aggregate
        self.num_docs = int(num_docs if num_docs is not None else (int(docs.max()) + 1 if len(docs) else 0))

    def __len__(self) -> int:
        return len(self.docs)

    def with_aggregate(self, aggregate: str) -> PassageMap:
        return PassageMap(self.docs, self.spans, aggregate, self.num_docs)

    @cached_property
    def first_rows(self) -> np.ndarray:
        """The row of every document's first passage (rows of one document are contiguous, in order)."""
        if not len(self.docs):
            return np.zeros(0, dtype=np.int64)
        head = np.ones(len(self.docs), dtype=bool)
        head[1:] = self.docs[1:] != self.docs[:-1]
        return np.flatnonzero(head).astype(np.int64)

    @cached_property
    def row_starts(self) -> np.ndarray:
        """(num_docs + 1,): document d's passages are rows ``row_starts[d]:row_starts[d + 1]``."""
        return np.searchsorted(self.docs, np.arange(self.num_docs + 1), side="left").astype(np.int64)

    def rows_of(self, positions: np.ndarray | None) -> np.ndarray | None:
        """The rows a search may visit: every passage of the documents ``positions`` (None: all documents), only
        the first passage for FirstP."""
        if self.aggregate == "firstp":
            rows = self.first_rows
            return rows if positions is None else rows[positions]
        if positions is None:
            return None
        starts, ends = self.row_starts[positions], self.row_starts[positions + 1]
        if not len(positions):
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(a, b) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)])

    def fold(self, scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """One query's passage hits (descending score; row -1 = none) -> its top ``k`` documents and scores."""
        ok = rows >= 0
        docs, scores = self.docs[rows[ok]], scores[ok]
        if self.aggregate == "sum":
            uniq, inverse = np.unique(docs, return_inverse=True)
            total = np.zeros(len(uniq), dtype=np.float64)
            np.add.at(total, inverse, scores)
            order = np.lexsort((uniq, -total))[:k]
            return uniq[order], total[order].astype(np.float32)
        uniq, first = np.unique(docs, return_index=True)  # hits come best first: a document's first is its max
        order = np.argsort(first, kind="stable")[:k]
        return uniq[order], scores[first[order]]

    def body_span(self, row: int) -> tuple[int, int]:
        return int(self.spans[row, 0]), int(self.spans[row, 1])
