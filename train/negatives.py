"""Hard negatives mined with BM25, guarded against false negatives."""

from __future__ import annotations

import contextlib
import logging
import random
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from retr.indexes.bm25 import build_bm25
from retr.retrieval.bm25 import BM25Config, BM25Retriever
from retr.retrieval.types import Qrels
from retr.train.data import Pair

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def temporary_bm25(doc_ids: Sequence[str], doc_texts: Sequence[str]) -> Iterator[BM25Retriever]:
    """A BM25 retriever over the training corpus, built once and removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="retr-bm25-") as tmp:
        build_bm25(list(doc_texts), Path(tmp) / "bm25", BM25Config())
        yield BM25Retriever(Path(tmp) / "bm25", doc_ids)


def mine_bm25_negatives(pairs: Sequence[Pair], bm25: BM25Retriever, qrels: Qrels | None, num_negatives: int,
                        seed: int, depth: int = 30, skip_top: int = 0,
                        max_relative_score: float = 0.95) -> list[list[str]]:
    """For each pair, ``num_negatives`` doc ids from BM25's top ``depth`` for its query.

    False-negative guard: a candidate judged for that query (any grade) is never used, nor the
    positive itself, nor one scoring within ``max_relative_score`` of the query's best-scored
    positive — near-duplicates of a positive are more often unjudged positives than negatives.
    """
    rng = random.Random(seed)
    doc_ids = bm25.ids
    run = bm25.search({f"{i}": p.query for i, p in enumerate(pairs)}, depth + 1 + skip_top)
    out: list[list[str]] = []
    short = 0
    for i, p in enumerate(pairs):
        hits = run[f"{i}"]
        judged: Mapping[str, int] = qrels[p.qid] if qrels is not None and p.qid in qrels else {}
        pos_scores = [h.score for h in hits if h.doc_id == p.positive_id or judged.get(h.doc_id, 0) > 0]
        ceiling = max_relative_score * max(pos_scores) if pos_scores else float("inf")
        cands = [h.doc_id for h in hits[skip_top:]
                 if h.doc_id != p.positive_id and h.doc_id not in judged and h.score < ceiling][:depth]
        if len(cands) < num_negatives:
            short += 1
            pool = [d for d in doc_ids if d != p.positive_id and d not in judged]
            cands += rng.sample(pool, min(len(pool), num_negatives - len(cands)))
        out.append(rng.sample(cands, num_negatives) if len(cands) > num_negatives else cands[:num_negatives])
    if short:
        logger.info("%d queries had too few BM25 negatives: topped up with random documents", short)
    return out
