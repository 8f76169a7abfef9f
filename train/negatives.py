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


def mine_model_negatives(model, pairs: Sequence[Pair], positive_text: Mapping[str, str], doc_ids: Sequence[str],
                         doc_texts: Sequence[str], qrels: Qrels | None, num_negatives: int, depth: int = 30,
                         relative_margin: float = 0.05) -> list[list[str] | None]:
    """For each pair, ``num_negatives`` doc ids drawn at random from ``model``'s own top ``depth`` for its query
    (sentence-transformers' ``mine_hard_negatives``; the global ``random`` seeds the draw), or None where too few
    are left. False-negative guard: every positive of the query is excluded, and every candidate scoring within
    ``relative_margin`` of its weakest positive (a near-duplicate of a positive); so is any document judged for
    the query at any grade, and any with the very text of one."""
    from datasets import Dataset as HFDataset
    from sentence_transformers.util import mine_hard_negatives

    extra = 2  # drawn beyond ``num_negatives``, for the judged ones dropped afterwards
    mined = mine_hard_negatives(
        HFDataset.from_dict({"anchor": [p.query for p in pairs], "positive": [positive_text[p.positive_id]
                                                                             for p in pairs]}),
        model, corpus=list(doc_texts), range_max=depth, relative_margin=relative_margin,
        num_negatives=num_negatives + extra, sampling_strategy="random", output_format="labeled-list", verbose=False)
    id_of = {t: d for d, t in reversed(list(zip(doc_ids, doc_texts, strict=True)))}  # a text's first document
    by_row = {(row["anchor"], row["positive"][0]): [id_of[t] for t in row["positive"][1:]] for row in mined}
    out: list[list[str] | None] = []
    for p in pairs:
        judged = set(qrels[p.qid]) if qrels is not None and p.qid in qrels else set()
        judged_texts = {positive_text.get(d) for d in judged | {p.positive_id}}
        negs = [d for d in by_row.get((p.query, positive_text[p.positive_id]), [])
                if d not in judged and positive_text.get(d) not in judged_texts]
        out.append(negs[:num_negatives] if len(negs) >= num_negatives else None)
    missing = sum(n is None for n in out)
    if missing:
        logger.info("%d of %d pairs had too few negatives in the model's top %d: left out", missing, len(pairs), depth)
    return out
