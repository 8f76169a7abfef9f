"""Cross-encoder reranking of a first stage's top ``depth`` documents: the rerank stage (``RerankRetriever``).

The cross-encoder model lives in ``retr.retrieval.rerank_model``, the weighting rules and the check record in
``retr.retrieval.rerank_check``; their public names are re-exported here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from retr.retrieval.errors import RetrError
from retr.retrieval.passages import PassageMap, passage_text
from retr.retrieval.protocol import Retriever, StageTimer
from retr.retrieval.rerank_check import (  # noqa: F401  (re-exported)
    CHECK_SEED,
    MIN_PSEUDO_QUERIES,
    PSEUDO_QUERIES,
    WEIGHT_RULE,
    WEIGHT_SOURCES,
    CorpusCheck,
    RerankWeight,
    checked_weight,
    interpolate,
    minmax,
    rerank_head,
    rule_weight,
    smoothed_best,
)
from retr.retrieval.rerank_model import (  # noqa: F401  (re-exported)
    DEFAULT_RERANK_DEPTH,
    DEFAULT_RERANK_MAX_LENGTH,
    CrossEncoderReranker,
    RerankConfig,
    check_cross_encoder_dir,
    cross_encoder_reading,
    cross_encoder_ref,
    trained_reading,
)
from retr.retrieval.stage import Stage
from retr.retrieval.types import Hit, Run

PASSAGES_PER_DOC = 2  # an index of passages: the cross-encoder scores this many of each candidate's passages


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


class RerankRetriever:
    """Reranks the first stage's top ``depth``; hits below it keep their order, after them. Over an index of
    passages, a document's score is the best of its ``PASSAGES_PER_DOC`` passages sharing most words with the
    query (the whole of a long document never fits the cross-encoder)."""

    def __init__(self, first: Retriever, reranker: CrossEncoderReranker, docstore, positions: Mapping[str, int],
                 passages: PassageMap | None = None, weight: RerankWeight | None = None):
        self.passages = passages
        self.weight = weight or RerankWeight(reranker.interpolation, "trained")
        self.first = first
        self.reranker = reranker
        self.docstore = docstore
        self.positions = positions
        self.depth = reranker.config.depth
        self.name = f"{first.name}+rerank"
        self.stages = tuple(dict.fromkeys(first.stages + ("rerank",)))

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        timer = timer or StageTimer()
        first = self.first.search(queries, max(k, self.depth), timer)
        out: dict[str, list[Hit]] = {}
        with timer.stage("rerank"):
            for qid, hits in first.items():
                head, tail = hits[: self.depth], hits[self.depth:]
                if self.weight.weight <= 0.0:  # turned down on this corpus: the first stage's order, nothing scored
                    out[qid] = rerank_head(head, tail, np.zeros(len(head), dtype=np.float32), 0.0)[:k]
                    continue
                texts, owner = self._texts(queries[qid], head)
                ce = self.reranker.score(queries[qid], texts)
                if len(owner) != len(head):  # passages: each document's best
                    best = np.full(len(head), -np.inf, dtype=np.float32)
                    np.maximum.at(best, owner, ce)
                    ce = best
                out[qid] = rerank_head(head, tail, ce, self.weight.weight)[:k]
        return Run(out)

    def _texts(self, query: str, head) -> tuple[list[str], np.ndarray]:
        """The texts the cross-encoder reads for ``head``, and the hit each belongs to."""
        docs = [(self.positions[h.doc_id], self.docstore.get(self.positions[h.doc_id])) for h in head]
        if self.passages is None:
            return [d.full_text() for _, d in docs], np.arange(len(docs))
        terms = _words(query)
        texts, owner = [], []
        starts = self.passages.row_starts
        for i, (pos, doc) in enumerate(docs):
            a, b = int(starts[pos]), int(starts[pos + 1])
            if b - a <= 1:
                texts.append(doc.full_text())
                owner.append(i)
                continue
            title = doc.title.strip()
            pieces = [doc.text[int(s):int(e)] for s, e in self.passages.spans[a:b]]
            overlap = np.asarray([len(terms & _words(x)) for x in pieces])
            for j in np.argsort(-overlap, kind="stable")[:PASSAGES_PER_DOC]:
                texts.append(passage_text(title, pieces[j]))
                owner.append(i)
        return texts, np.asarray(owner, dtype=np.int64)


def _build(ctx, node, inputs) -> RerankRetriever:
    if ctx.reranker is None:
        raise RetrError(f"pipeline {str(node)!r} needs a cross-encoder: pass --rerank DIR")
    parts = ctx.parts
    return RerankRetriever(inputs[0], ctx.reranker, parts.docstore, parts.positions,
                           parts.passages(ctx.config.passage_aggregate), parts.rerank_weight(ctx.reranker))


STAGE = Stage("rerank", "step", _build, "the cross-encoder rescores the top --rerank-depth hits",
              needs=("rerank",))
