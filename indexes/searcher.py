"""Search one index folder by pipeline name: the one path `retr search`, the Python API and `retr serve` share.

Opens the folder (checked), resolves the query encoder from its manifest (identity checked before any graph is
loaded) the first time a dense pipeline needs it, and keeps one cross-encoder per folder asked for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from retr.indexes.shards import open_index
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.pipeline import PipelineConfig, PipelineFactory, PipelineSpec
from retr.retrieval.protocol import StageTimer
from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig
from retr.retrieval.types import check_query, filter_value


@dataclass(frozen=True)
class SearchHit:
    rank: int
    id: str
    score: float
    title: str
    text: str
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SearchResult:
    query: str
    pipeline: str
    k: int
    hits: list[SearchHit]
    latency_ms: dict[str, float] = field(default_factory=dict)  # per stage, and "total"

    def to_dict(self) -> dict:
        """The JSON shape of `retr search --json` (and of `retr serve`'s /search)."""
        return {"query": self.query, "pipeline": self.pipeline, "k": self.k,
                "results": [h.__dict__ for h in self.hits], "latency_ms": dict(self.latency_ms)}


class Searcher:
    """Pipelines over one index folder. Safe to share between threads: retrievers are made under a lock, then
    searches run concurrently (FAISS, BM25 and ONNX Runtime read shared state; an OpenVINO runner serialises its
    own calls)."""

    def __init__(self, folder: str | Path, encoder: EncoderConfig | None = None,
                 pipeline: PipelineConfig | None = None, rerank: RerankConfig | None = None,
                 checker: Callable | None = None):
        """``encoder``: the query encoder's options (its model defaults to the one that built the index);
        ``rerank``: the options (depth, length, backend, weight) of the cross-encoders asked for by folder in
        ``search(rerank=...)``; ``checker(index, encoder, reranker, pipeline)``: run once per cross-encoder
        trained on another corpus (``retr.eval.pseudo.check_index_reranker``: the reranker check)."""
        self.index = open_index(folder)
        self._options = (encoder, pipeline, rerank)
        self._checker = checker
        self._factory = PipelineFactory(self.index, config=pipeline or PipelineConfig(),
                                        encoder_config=encoder or EncoderConfig())
        self._rerank = rerank
        self._rerankers: dict[str, CrossEncoderReranker] = {}
        self._positions = {d: i for i, d in enumerate(self.index.ids)}
        self._lock = threading.Lock()
        self._filters: dict[tuple, np.ndarray] = {}  # filter -> allowed positions (the last 64 used)

    @property
    def encoder(self) -> BiEncoder:
        return self._factory.encoder

    def reopened(self) -> Searcher:
        """A searcher over the folder's current generation, with this one's options; the loaded query encoder and
        cross-encoders carry over when the new generation was built by the same model."""
        new = Searcher(self.index.folder, *self._options)  # no checker: a new generation never stops to check
        old = self._factory._encoder
        if old is not None and new.index.dense_info["model"]["hash"] == old.model_hash:
            new._factory._encoder = old
        new._rerankers = dict(self._rerankers)
        before, after = self._factory, new._factory
        if after.corpus_sha256 != before.corpus_sha256 and after.dense_model_hash == before.dense_model_hash:
            for reranker in new._rerankers.values():  # documents added or deleted: the check made before carries
                check = reranker.find_check(before.corpus_sha256, before.dense_model_hash)
                if check is not None:
                    reranker.adopt(replace(check, corpus_sha256=after.corpus_sha256))
        return new

    def reranker(self, model: str) -> CrossEncoderReranker:
        """The cross-encoder in folder ``model``, loaded (and checked on this corpus, where that applies) once."""
        if model not in self._rerankers:
            options = {**self._rerank.__dict__, "model": model} if self._rerank else {"model": model}
            self._rerankers[model] = CrossEncoderReranker(RerankConfig(**options))
        reranker, factory = self._rerankers[model], self._factory
        if self._checker is not None and factory.dense_model_hash is not None \
                and reranker.needs_check(factory.corpus_sha256) \
                and reranker.find_check(factory.corpus_sha256, factory.dense_model_hash) is None:
            self._checker(self.index, factory.encoder, reranker, factory.config)
        return reranker

    def allowed(self, conditions: Mapping[str, object] | None) -> np.ndarray | None:
        """The positions of the documents whose metadata holds every ``field: value`` of ``conditions``."""
        if not conditions:
            return None
        wanted = {str(k): filter_value(v) for k, v in conditions.items()}
        key = tuple(sorted(wanted.items()))
        if key not in self._filters:
            if len(self._filters) >= 64:
                self._filters.pop(next(iter(self._filters)))
            found, have = self.index.docstore.positions_where(wanted)
            if not len(found):
                missing = sorted(set(wanted) - have)
                if missing:
                    raise RetrError(f"{self.index.folder}: no document has a field {missing[0]!r} to filter on "
                                    f"(fields: {', '.join(sorted(have)) or 'none'})")
            self._filters[key] = found
        return self._filters[key]

    def search_many(self, queries: Sequence[str], k: int = 10, mode: str = "dense",
                    rerank: str | None = None, filter: Mapping[str, object] | None = None) -> list[SearchResult]:
        """One result per query, each searched alone (a query's hits never depend on the others). ``mode``:
        bm25, dense or hybrid; ``rerank``: a cross-encoder folder rescoring the top ``depth``; ``filter``:
        ``{field: value}`` that every hit's metadata must hold (every stage searches only those documents, so
        k hits come back whenever k matching documents exist)."""
        if k < 1:
            raise RetrError(f"k must be >= 1, got {k}")
        texts = [check_query(q) for q in queries]
        spec = PipelineSpec.parse(mode + ("+rerank" if rerank else ""))
        with self._lock:  # lazy parts (encoder, its query graph, BM25, cross-encoder, filters) are made once
            retriever = self._factory.make(spec, self.reranker(rerank) if rerank else None, self.allowed(filter))
            if spec.uses_dense:
                _ = self._factory.encoder.query_graph
        out = []
        for q in texts:
            timer = StageTimer()
            t0 = time.perf_counter()
            hits = retriever.search({"q": q}, k, timer)["q"]
            total = time.perf_counter() - t0
            docs = [self.index.docstore.get(self._positions[h.doc_id]) for h in hits]
            out.append(SearchResult(
                query=q, pipeline=spec.name, k=k,
                hits=[SearchHit(r, h.doc_id, h.score, d.title, d.text, dict(d.metadata))
                      for r, (h, d) in enumerate(zip(hits, docs, strict=True), start=1)],
                latency_ms={**{s: v * 1000.0 for s, v in timer.seconds.items()}, "total": total * 1000.0}))
        return out

    def search(self, query: str, k: int = 10, mode: str = "dense", rerank: str | None = None,
               filter: Mapping[str, object] | None = None) -> SearchResult:
        return self.search_many([query], k, mode, rerank, filter)[0]

    def document(self, doc_id: str):
        """The stored document ``doc_id``, or None when the index does not hold it."""
        position = self._positions.get(doc_id)
        return None if position is None else self.index.docstore.get(position)

    def close(self) -> None:
        self.index.close()
