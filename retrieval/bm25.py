"""BM25 with bm25s (sparse matrices, memory-mapped on load) and an English Snowball stemmer."""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retr.retrieval.errors import RetrError
from retr.retrieval.mapped import MappedFile, check_all
from retr.retrieval.protocol import StageTimer
from retr.retrieval.types import Hit, Run, check_float, trec_sorted

logger = logging.getLogger(__name__)

BM25_DIR = "bm25"
CONFIG = "retr_bm25.json"
MIN_QUERIES_PER_THREAD = 8  # fewer queries than this a thread: one thread (starting threads costs more)


METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")  # bm25s's variants (Kamphuis et al., 2020)
DELTA_METHODS = ("bm25l", "bm25+")  # the variants that read ``delta``
K1_MAX = 100.0  # BM25 k1 in [0, 100]; b in [0, 1]; delta in [0, 10] (docs/reference/cli.md)
DELTA_MAX = 10.0
# bm25s's stopword lists, by the Snowball stemmer's language name; other languages are stemmed without stopwords
STOPWORDS = {"english": "en", "german": "de", "dutch": "nl", "french": "fr", "spanish": "es", "portuguese": "pt",
             "italian": "it", "russian": "ru", "swedish": "sv", "norwegian": "no", "turkish": "tr", "danish": "da"}
NO_LANGUAGE = "none"  # lowercase and split only: no stemmer, no stopwords


def languages() -> tuple[str, ...]:
    """What ``--bm25-language`` accepts: every Snowball stemmer PyStemmer has, and ``none``."""
    import Stemmer

    return (*sorted(a for a in Stemmer.algorithms() if a not in ("porter", "dutch_porter")), NO_LANGUAGE)


@dataclass(frozen=True)
class BM25Config:
    """How BM25 scores (``method``: one of ``METHODS``; ``k1``, ``b``; ``delta`` for bm25l and bm25+) and how
    text becomes terms (a Snowball ``stemmer`` and a bm25s ``stopwords`` list, or None for none)."""

    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"
    stemmer: str | None = "english"
    stopwords: str | None = "en"
    delta: float = 0.5

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise RetrError(f"BM25 method {self.method!r}: choose one of {', '.join(METHODS)}")
        # k1 past ~3 is tf saturation turned off in practice; at 1e30 every score was 0.0 and at 1e308 BM25 found
        # nothing (a hybrid silently dense-only): bounded, as b and delta
        check_float(self.k1, "BM25 k1", 0.0, K1_MAX)
        check_float(self.b, "BM25 b", 0.0, 1.0)
        check_float(self.delta, "BM25 delta", 0.0, DELTA_MAX)

    @classmethod
    def for_language(cls, language: str = "english", **scoring) -> BM25Config:
        """Snowball's stemmer for ``language`` and bm25s's stopwords where it has a list for it (``none``: neither);
        ``scoring``: k1, b, method, delta."""
        if language != NO_LANGUAGE and language not in languages():
            raise RetrError(f"BM25 language {language!r}: choose one of {', '.join(languages())}")
        if language == NO_LANGUAGE:
            return cls(stemmer=None, stopwords=None, **scoring)
        return cls(stemmer=language, stopwords=STOPWORDS.get(language), **scoring)

    @property
    def language(self) -> str:
        return self.stemmer or NO_LANGUAGE

    def describe(self) -> str:
        """One line for a report: ``lucene k1=1.5 b=0.75, english (stopwords en)``."""
        delta = f" delta={self.delta:g}" if self.method in DELTA_METHODS else ""
        words = f"{self.language} ({'stopwords ' + self.stopwords if self.stopwords else 'no stopwords'})"
        return f"{self.method} k1={self.k1:g} b={self.b:g}{delta}, {words}"


@functools.lru_cache(maxsize=4)
def _stemmer(language: str | None):
    if not language:
        return None
    import Stemmer

    return Stemmer.Stemmer(language)


def _stopwords(name: str | None) -> list[str]:
    if not name:
        return []
    from bm25s.tokenization import _infer_stopwords

    return list(_infer_stopwords(name))


def tokenizer_options(cfg: BM25Config) -> dict:
    """``bm25s.tokenize``'s options for ``cfg`` (the one definition of how BM25 text is tokenised)."""
    return {"stopwords": cfg.stopwords or [], "stemmer": _stemmer(cfg.stemmer)}


def analyzer(cfg: BM25Config = BM25Config()):
    """A ``text -> terms`` function: bm25s's tokenisation (lowercase, \\w\\w+, stopwords, Snowball) without its
    per-call overhead; the terms a query is matched on."""
    split = re.compile(r"(?u)\b\w\w+\b").findall
    stop = frozenset(_stopwords(cfg.stopwords))
    stem = _stemmer(cfg.stemmer)

    def terms(text: str) -> list[str]:
        words = [w for w in split(text.lower()) if w not in stop]
        return stem.stemWords(words) if stem is not None else words

    return terms


def tokenize(texts: Sequence[str], cfg: BM25Config) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(list(texts), **tokenizer_options(cfg), return_ids=False, show_progress=False)


class BM25Retriever:
    """Retriever protocol over a saved bm25s index; doc positions map to ``ids``."""

    name = "bm25"
    stages = ("bm25",)

    def __init__(self, folder: Path, ids: Sequence[str]):
        import bm25s

        cfg_path = folder / CONFIG
        if not cfg_path.is_file():
            raise RetrError(f"{cfg_path}: missing: the index has no BM25 part (rebuild it with `retr index`, without --no-bm25)")
        self.cfg = BM25Config(**json.loads(cfg_path.read_text()))
        self.model = bm25s.BM25.load(str(folder), mmap=True, show_progress=False)
        # the score matrix's arrays are mapped: checked before each query (never SIGBUS on a file cut short)
        self._mapped = [MappedFile(folder / f"{name}.csc.index.npy") for name in ("data", "indices", "indptr")]
        self.ids = list(ids)
        self.vocab = self.model.vocab_dict
        self._terms = analyzer(self.cfg)
        self.mask: np.ndarray | None = None  # positions a metadata filter allows (``restricted``); None: all
        self.threads = os.cpu_count() or 1  # a batch of queries is spread over this many threads
        n = int(self.model.scores["num_docs"])
        if n != len(self.ids):
            raise RetrError(f"{folder}: BM25 index holds {n} documents but the id list has {len(self.ids)}")

    def restricted(self, allowed: np.ndarray | None) -> BM25Retriever:
        """The same index (shared, not reloaded) returning only the positions ``allowed``."""
        if allowed is None:
            return self
        other = copy.copy(self)
        other.mask = np.zeros(len(self.ids), dtype=bool)
        other.mask[allowed] = True
        return other

    def _query_ids(self, text: str) -> list[int]:
        """The vocabulary ids of ``text``'s terms (``analyzer``)."""
        vocab = self.vocab
        return [vocab[w] for w in self._terms(text) if w in vocab]

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        """Each query ranked alone; many queries are spread over ``threads`` threads (as bm25s's own batch
        retrieval does: its numpy scoring releases the GIL for much of the work), in contiguous parts, so the
        run is the same whatever the thread count."""
        timer = timer or StageTimer()
        k_eff = min(k, len(self.ids))
        items = list(queries.items())
        with timer.stage("bm25"):
            threads = min(self.threads, len(items) // MIN_QUERIES_PER_THREAD)
            if threads <= 1:
                return Run(self._rank(items, k_eff))
            from concurrent.futures import ThreadPoolExecutor

            size = -(-len(items) // threads)
            with ThreadPoolExecutor(threads, thread_name_prefix="retr-bm25") as pool:
                parts = list(pool.map(lambda i: self._rank(items[i:i + size], k_eff), range(0, len(items), size)))
        return Run({qid: hits for part in parts for qid, hits in part.items()})

    def _rank(self, items: list[tuple[str, str]], k_eff: int) -> dict[str, list[Hit]]:
        ids = self.ids
        out: dict[str, list[Hit]] = {}
        for qid, text in items:
            token_ids = self._query_ids(text)
            if not token_ids or k_eff == 0:
                out[qid] = []
                continue
            check_all(self._mapped)
            scores = self.model.get_scores_from_ids(token_ids)
            if self.mask is not None:
                scores = np.where(self.mask, scores, 0.0)
            if k_eff < len(scores):
                top = np.argpartition(-scores, k_eff - 1)[:k_eff]
                # every document tied with the k-th joins, and trec order (score, then id) picks among them:
                # the cut never depends on the partition's order, so a sharded index cuts where this one does
                top = np.union1d(top, np.flatnonzero(scores == scores[top].min()))
            else:
                top = np.arange(len(scores))
            top = top[scores[top] > 0]
            out[qid] = trec_sorted(Hit(ids[d], s) for d, s in zip(top.tolist(), scores[top].tolist(),
                                                                   strict=True))[:k_eff]
        return out
