"""Training data: (query, positive) pairs from qrels or from an unlabeled corpus, and a dev split."""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from retr.retrieval.types import Document, Qrels


@dataclass(frozen=True)
class Pair:
    query: str
    positive_id: str
    qid: str


def split_dev(qrels: Qrels, fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Carve a dev split from the training queries (fixed seed, independent of file order)."""
    qids = sorted(q for q in qrels if qrels.num_relevant(q) > 0)
    random.Random(seed).shuffle(qids)
    n_dev = int(round(len(qids) * fraction))
    return sorted(qids[n_dev:]), sorted(qids[:n_dev])


def labeled_pairs(queries: Mapping[str, str], qrels: Qrels, qids: Sequence[str]) -> list[Pair]:
    """One pair per (query, relevant document)."""
    return [Pair(queries[q], d, q) for q in qids for d, g in sorted(qrels[q].items()) if g > 0 and queries[q].strip()]


_SENT = re.compile(r"(?<=[.!?])\s+")


def self_supervised_pairs(docs: Sequence[Document], seed: int, min_chars: int = 20) -> tuple[list[Pair], dict[str, str]]:
    """Pairs from an unlabeled corpus: title -> body where a title exists, else one sentence -> the rest.

    Returns the pairs and the texts that stand for their positives (the body without the sentence
    used as the query, so the model cannot match a query to its own copy).
    """
    rng = random.Random(seed)
    pairs: list[Pair] = []
    positives: dict[str, str] = {}
    for d in docs:
        body = d.text.strip()
        if d.title.strip() and len(body) >= min_chars:
            pairs.append(Pair(d.title.strip(), d.doc_id, f"ss:{d.doc_id}"))
            positives[d.doc_id] = body
            continue
        sents = [s for s in _SENT.split(body) if len(s) >= min_chars]
        if len(sents) < 2:
            continue
        i = rng.randrange(len(sents))
        pairs.append(Pair(sents[i], d.doc_id, f"ss:{d.doc_id}"))
        positives[d.doc_id] = " ".join(sents[:i] + sents[i + 1:])
    return pairs, positives


def pairs_digest(pairs: Sequence[Pair]) -> str:
    h = hashlib.sha256()
    for p in pairs:
        h.update(f"{p.qid}\x1f{p.positive_id}\x1f{p.query}\x1e".encode())
    return h.hexdigest()
