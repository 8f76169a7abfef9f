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
from retr.retrieval.stage import Stage
from retr.retrieval.types import Hit, Run, check_float, trec_sorted

logger = logging.getLogger(__name__)

BM25_DIR = "bm25"
CONFIG = "retr_bm25.json"
TOKENS = "retr_tokens.npy"  # every row's token ids, concatenated (int32)
TOKEN_OFFSETS = "retr_token_offsets.npy"  # row i's ids are TOKENS[offsets[i]:offsets[i + 1]]
TOKEN_VOCAB = "retr_token_vocab.json"  # id -> token (the ids of bm25s's vocabulary)
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


@dataclass(frozen=True)
class TermStats:
    """What query expansion reads of a BM25 folder: each vocabulary id's term, in how many documents it occurs,
    and each document's term ids (the tokens the index was built from, memory-mapped)."""

    terms: list[str]
    doc_freq: np.ndarray
    tokens: np.ndarray
    offsets: np.ndarray

    @classmethod
    def load(cls, folder: Path, model) -> TermStats:
        if not (folder / TOKENS).is_file():
            raise RetrError(f"{folder}: this BM25 part keeps no document tokens (built by an older retr): rebuild "
                            f"the index to expand queries from it")
        terms = [""] * len(model.vocab_dict)
        for term, i in model.vocab_dict.items():
            terms[i] = term
        tokens, offsets = np.load(folder / TOKENS, mmap_mode="r"), np.load(folder / TOKEN_OFFSETS)
        if len(offsets) != int(model.scores["num_docs"]) + 1 or offsets[-1] != len(tokens):
            raise RetrError(f"{folder / TOKENS}: does not match its offsets or the BM25 index: rebuild the index")
        return cls(terms, np.diff(np.asarray(model.scores["indptr"])), tokens, offsets)

    @property
    def num_docs(self) -> int:
        return len(self.offsets) - 1

    def doc_terms(self, position: int) -> np.ndarray:
        """The term ids of document ``position``, in order, repeats kept."""
        return np.asarray(self.tokens[int(self.offsets[position]):int(self.offsets[position + 1])])


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
        self.folder = folder
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
        self._stats: list[TermStats] = []  # made once, shared with the restricted copies

    @property
    def stats(self) -> TermStats:
        """The index's terms, document frequencies and each document's term ids (read once when asked)."""
        if not self._stats:
            self._stats.append(TermStats.load(self.folder, self.model))
        return self._stats[0]

    def query_terms(self, text: str) -> list[str]:
        """``text``'s terms as BM25 matches them (``analyzer``), those outside the vocabulary included."""
        return self._terms(text)

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
        return self._search([(qid, self._query_ids(text), None) for qid, text in queries.items()], k, timer)

    def search_weighted(self, queries: Mapping[str, Mapping[int, float]], k: int,
                        timer: StageTimer | None = None) -> Run:
        """Each query a weighted bag of vocabulary ids (``{term id: weight}``): a document scores the weighted
        sum of its BM25 term scores (Lucene's boosted term queries; RM3's expanded query)."""
        return self._search([(qid, list(w), list(w.values())) for qid, w in queries.items()], k, timer)

    def _search(self, items: list[tuple[str, list[int], list[float] | None]], k: int, timer: StageTimer | None) -> Run:
        timer = timer or StageTimer()
        k_eff = min(k, len(self.ids))
        with timer.stage("bm25"):
            threads = min(self.threads, len(items) // MIN_QUERIES_PER_THREAD)
            if threads <= 1:
                return Run(self._rank(items, k_eff))
            from concurrent.futures import ThreadPoolExecutor

            size = -(-len(items) // threads)
            with ThreadPoolExecutor(threads, thread_name_prefix="retr-bm25") as pool:
                parts = list(pool.map(lambda i: self._rank(items[i:i + size], k_eff), range(0, len(items), size)))
        return Run({qid: hits for part in parts for qid, hits in part.items()})

    def _weighted_scores(self, token_ids: list[int], weights: list[float]) -> np.ndarray:
        s = self.model.scores
        data, indices, indptr = s["data"], s["indices"], s["indptr"]
        scores = np.zeros(len(self.ids), dtype=np.float64)
        for t, w in zip(token_ids, weights, strict=True):  # a column's rows are distinct documents
            a, b = int(indptr[t]), int(indptr[t + 1])
            scores[indices[a:b]] += w * data[a:b].astype(np.float64)
        extra = getattr(self.model, "nonoccurrence_array", None)  # bm25l, bm25+: a term's score where absent
        if extra is not None:
            scores += float(np.dot(np.asarray(extra, dtype=np.float64)[token_ids], weights))
        return scores

    def _rank(self, items: list[tuple[str, list[int], list[float] | None]], k_eff: int) -> dict[str, list[Hit]]:
        ids = self.ids
        out: dict[str, list[Hit]] = {}
        for qid, token_ids, weights in items:
            if not token_ids or k_eff == 0:
                out[qid] = []
                continue
            check_all(self._mapped)
            scores = (self.model.get_scores_from_ids(token_ids) if weights is None
                      else self._weighted_scores(token_ids, weights))
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


STAGE = Stage("bm25", "source", lambda ctx, node, inputs: ctx.parts.bm25(ctx.allowed),
              "BM25 over the index's BM25 part", needs=("bm25",))
