"""RM3 pseudo-relevance feedback (``X+rm3``): the query expanded with terms of pipeline X's top documents, then
searched with BM25.

The relevance model of Lavrenko & Croft (2001, RM1) mixed with the query (RM3, Abdul-Jaleel et al., 2004), as
Anserini (Pyserini's ``set_rm3``) computes it, with its defaults ``fb_terms=10, fb_docs=10,
original_query_weight=0.5`` (PyTerrier's RM3 takes the same three):

1. the first pass (X) ranks the documents; its top ``fb_docs`` D_1..D_n, with their scores s_i, are the feedback;
2. each D_i is a vector of its term counts tf(t, D_i) (the tokens the BM25 part indexed: stemmed, stopwords
   out), over the terms of 2 to 20 characters of ``[a-z0-9]`` that occur in at most 10% of the documents;
   only its ``fb_terms`` most frequent terms are kept, and P(t | D_i) = tf(t, D_i) / (the kept counts' sum);
3. the relevance model RM1(t) = sum_i P(t | D_i) * s_i, cut to its ``fb_terms`` largest and scaled to sum 1;
4. the query model P(t | Q) = (count of t in the analysed query) / (its number of terms);
5. RM3(t) = w * P(t | Q) + (1 - w) * RM1(t), w = ``original_query_weight``;
6. BM25 scores each document sum_t RM3(t) * BM25(t, d) (Lucene's boosted term queries).

Ties (a cut among terms of equal weight) are broken by the term, so the expansion does not depend on an order
nobody chose (Anserini's is a hash map's). The first pass may be any pipeline (``dense+rm3``: feedback from the
bi-encoder's ranking, its cosine scores as s_i); the second pass is BM25 over the same index (a sharded index:
each shard searched with the expanded query and the lists merged, document frequencies summed over the shards,
so the run equals the unsharded index's).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from retr.retrieval.bm25 import BM25Retriever
from retr.retrieval.protocol import Retriever, StageTimer
from retr.retrieval.shards import Merged, merge_runs
from retr.retrieval.stage import Option, Stage
from retr.retrieval.types import Hit, Run

MAX_DOC_FREQ = 0.1  # a feedback term occurs in at most this share of the documents (Anserini's threshold)
_FEEDBACK_TERM = re.compile(r"[a-z0-9]{2,20}")


def _top(weights: Mapping[str, float], n: int) -> dict[str, float]:
    """The ``n`` largest of ``weights``, ties broken by the term."""
    return dict(sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))[:n])


def _unit(weights: Mapping[str, float]) -> dict[str, float]:
    total = sum(abs(v) for v in weights.values())
    return {t: v / total for t, v in weights.items()} if total > 0 else {}


class RM3Retriever:
    """``feedback``'s top ``fb_docs`` expand each query (``expansion``); ``bm25`` searches the expanded query."""

    def __init__(self, feedback: Retriever, bm25: BM25Retriever | ShardedTerms, positions: Mapping[str, int],
                 fb_terms: int = 10, fb_docs: int = 10, original_query_weight: float = 0.5, name: str = "bm25+rm3"):
        self.feedback, self.bm25, self.positions = feedback, bm25, positions
        self.fb_terms, self.fb_docs, self.weight = fb_terms, fb_docs, original_query_weight
        self.name = name
        self.stages = tuple(dict.fromkeys((*feedback.stages, "rm3", "bm25")))
        self._stats = bm25.stats
        self._eligible: dict[int, bool] = {}

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        timer = timer or StageTimer()
        first = self.feedback.search(queries, self.fb_docs, timer)
        vocab = self.bm25.vocab
        with timer.stage("rm3"):
            expanded = {}
            for qid, text in queries.items():
                weights = self.expansion(text, first.get(qid, ()))
                expanded[qid] = {vocab[t]: w for t, w in sorted(weights.items()) if t in vocab}
        return self.bm25.search_weighted(expanded, k, timer)

    def expansion(self, query: str, feedback: Sequence[Hit]) -> dict[str, float]:
        """The expanded query: term -> weight (step 5), from ``query`` and the first pass's ranked ``feedback``."""
        counts = Counter(self.bm25.query_terms(query))
        original = _unit(counts)
        model = self.relevance_model(feedback[:self.fb_docs])
        w = self.weight
        return {t: w * original.get(t, 0.0) + (1 - w) * model.get(t, 0.0) for t in {*original, *model}}

    def relevance_model(self, feedback: Sequence[Hit]) -> dict[str, float]:
        """RM1 over the feedback documents (steps 2 and 3): term -> weight, summing to 1 (empty: no feedback)."""
        stats = self._stats
        model: dict[str, float] = {}
        for hit in feedback:
            ids, counts = np.unique(stats.doc_terms(self.positions[hit.doc_id]), return_counts=True)
            vector = _top({stats.terms[i]: float(c) for i, c in zip(ids.tolist(), counts.tolist(), strict=True)
                           if self._feedback_term(i)}, self.fb_terms)
            norm = sum(vector.values())
            if norm <= 0.001:  # a document without an eligible term adds nothing
                continue
            for term, count in vector.items():
                model[term] = model.get(term, 0.0) + count / norm * hit.score
        return _unit(_top(model, self.fb_terms))

    def _feedback_term(self, term_id: int) -> bool:
        found = self._eligible.get(term_id)
        if found is None:
            stats = self._stats
            found = bool(_FEEDBACK_TERM.fullmatch(stats.terms[term_id])) and \
                stats.doc_freq[term_id] / stats.num_docs <= MAX_DOC_FREQ
            self._eligible[term_id] = found
        return found


class ShardedTerms:
    """What RM3 reads of a sharded index's BM25 parts (each a shard's rows with the collection's vocabulary and
    statistics): the vocabulary, each term's document frequency summed over the shards, a document's tokens by
    its position in the whole index (shards in order), and a weighted search fanned out and merged."""

    def __init__(self, parts: Sequence[BM25Retriever]):
        self.parts = list(parts)
        self.vocab = self.parts[0].vocab
        stats = [p.stats for p in self.parts]
        self.terms = stats[0].terms
        self.doc_freq = np.sum([st.doc_freq for st in stats], axis=0)
        self.starts = np.cumsum([0, *(st.num_docs for st in stats)])
        self.num_docs = int(self.starts[-1])
        self._stats = stats

    @property
    def stats(self) -> ShardedTerms:
        return self

    def doc_terms(self, position: int) -> np.ndarray:
        shard = int(np.searchsorted(self.starts, position, side="right")) - 1
        return self._stats[shard].doc_terms(position - int(self.starts[shard]))

    def query_terms(self, text: str) -> list[str]:
        return self.parts[0].query_terms(text)

    def search_weighted(self, queries: Mapping[str, Mapping[int, float]], k: int, timer: StageTimer) -> Run:
        return merge_runs([p.search_weighted(queries, k, timer) for p in self.parts], k)


def _build(ctx, node, inputs: Sequence[Retriever]) -> RM3Retriever:
    bm25 = ctx.parts.bm25(ctx.allowed)
    if isinstance(bm25, Merged):  # a sharded index
        bm25 = ShardedTerms(bm25.parts)
    return RM3Retriever(inputs[0], bm25, ctx.parts.positions, node.option("fb_terms"), node.option("fb_docs"),
                        node.option("original_query_weight"), str(node))


STAGE = Stage("rm3", "step", _build, "RM3 pseudo-relevance feedback: the query expanded from the top documents "
              "of the pipeline before it, searched with BM25", needs=("bm25",),
              options={"fb_terms": Option(10, int, low=1), "fb_docs": Option(10, int, low=1),
                       "original_query_weight": Option(0.5, float, low=0.0, high=1.0)})
