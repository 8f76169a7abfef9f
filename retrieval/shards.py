"""Fan a search out over the shards of an index and merge: each shard answers with its own top k, the merged
top k is the best k of those (every document lives in exactly one shard, so nothing is lost or counted twice).

The query is encoded once for all shards; BM25 shards carry the whole collection's statistics, so their scores,
and hence the merge, equal an unsharded index's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from retr.retrieval.dense import DenseRetriever, encoded_search
from retr.retrieval.protocol import Retriever, StageTimer
from retr.retrieval.types import Run, trec_sorted


def merge_runs(runs: Sequence[Run], k: int) -> Run:
    """Per query, the best ``k`` hits of all ``runs`` (trec order), which hold disjoint documents."""
    if not runs:
        return Run({})
    return Run({qid: trec_sorted(h for run in runs for h in run.get(qid, ()))[:k] for qid in runs[0]})


def split_positions(allowed: np.ndarray | None, offsets: np.ndarray) -> list[np.ndarray | None]:
    """Positions of the whole index -> each shard's own (shard i holds ``offsets[i]:offsets[i + 1]``)."""
    if allowed is None:
        return [None] * (len(offsets) - 1)
    return [allowed[(allowed >= a) & (allowed < b)] - a for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(),
                                                                        strict=True)]


class ShardedDense:
    """Dense retrieval over shards: one query encoding, every shard's FAISS index searched, merged."""

    name = "dense"
    stages = ("encode", "ann")

    def __init__(self, parts: Sequence[DenseRetriever]):
        self.parts = list(parts)
        self.encoder = self.parts[0].encoder

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        return encoded_search(self.encoder, queries, k, timer, self.search_vectors)

    def search_vectors(self, qids: list[str], q: np.ndarray, k: int) -> Run:
        return merge_runs([p.search_vectors(qids, q, k) for p in self.parts], k)


class Merged:
    """Any retriever's shards (BM25's): each searched, the runs merged."""

    def __init__(self, parts: Sequence[Retriever]):
        self.parts = list(parts)
        self.name = self.parts[0].name
        self.stages = self.parts[0].stages

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        timer = timer or StageTimer()
        return merge_runs([p.search(queries, k, timer) for p in self.parts], k)
