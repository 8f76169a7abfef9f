"""Search one index folder with a pipeline value: the one path `retr search`, the Python API, `retr serve` and
`retr eval` share.

Opens the folder (checked), resolves the query encoder from its manifest (identity checked before any graph is
loaded) the first time a dense pipeline needs it, and keeps one cross-encoder per folder asked for.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

import numpy as np

from retr.indexes.shards import open_index
from retr.retrieval.compose import IndexParts, build
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.options import with_options
from retr.retrieval.pipeline import Pipeline, PipelineConfig
from retr.retrieval.protocol import Retriever, StageTimer
from retr.retrieval.request import SearchRequest
from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig
from retr.retrieval.rerank_check import CorpusCheck
from retr.retrieval.types import Run, filter_value


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


BATCH = 64  # queries a batch search hands the pipeline at once: encoded together, searched together


def _chunks(ids: list[str], queries: Sequence[str], size: int, encoder: BiEncoder | None):
    """``{id: query}`` parts of at most ``size`` queries. With a query encoder, each part holds queries of one
    token length: encoded together without padding, a query's vector is the one it gets alone, bit for bit
    (padded to a longer neighbour, the attention sums run over more positions and round differently)."""
    if encoder is None or len(ids) == 1:  # one query: nothing to group (a single search tokenises it once)
        groups = [list(range(len(ids)))]
    else:
        prompt = encoder.prompts.query or ""
        lengths = encoder.tokens.token_counts([prompt + q for q in queries]).tolist()
        by_length: dict[int, list[int]] = {}
        for i, n in enumerate(lengths):
            by_length.setdefault(min(n, encoder.max_length), []).append(i)
        groups = list(by_length.values())
    for group in groups:
        for start in range(0, len(group), size):
            yield {ids[i]: queries[i] for i in group[start:start + size]}


class Searcher:
    """Pipelines over one index folder. Safe to share between threads: retrievers are made under a lock, then
    searches run concurrently (FAISS, BM25 and ONNX Runtime read shared state; an OpenVINO runner serialises its
    own calls)."""

    def __init__(self, folder, encoder: EncoderConfig | None = None, pipeline: PipelineConfig | None = None,
                 rerank: RerankConfig | None = None, *, query_encoder: BiEncoder | None = None,
                 rerankers: Mapping[str, CrossEncoderReranker] | None = None):
        """``folder``: an index folder (or an index already opened: the searcher then owns it, and closes it);
        ``encoder``: the query encoder's options (its model defaults to the one that built the index);
        ``pipeline``: the options a pipeline leaves open (the fusion, its depth, the passage aggregate);
        ``rerank``: the options (depth, length, backend, weight) of the cross-encoders asked for by folder in
        ``search(rerank=...)``; ``query_encoder``: one already made for this index (checked by the caller);
        ``rerankers``: cross-encoders already made, by folder. A cross-encoder trained on another corpus takes
        the check stored beside the index, where there is one (``retr.eval.pseudo.check_index_reranker`` makes
        it: `retr check-reranker`, `retr serve`, `retr eval`)."""
        self.index = open_index(folder) if isinstance(folder, (str, os.PathLike)) else folder
        self._options = (encoder, pipeline, rerank)
        self.config = pipeline or PipelineConfig()
        self.parts = IndexParts(self.index, query_encoder, encoder or EncoderConfig())
        self._rerank = rerank
        self._rerankers: dict[str, CrossEncoderReranker] = dict(rerankers or {})
        for reranker in self._rerankers.values():
            self._adopt_stored_check(reranker)
        self._positions = self.parts.positions
        self._lock = threading.Lock()
        self._filters: dict[tuple, np.ndarray] = {}  # filter -> allowed positions (the last 64 used)
        self._closed = False

    @property
    def encoder(self) -> BiEncoder:
        return self.parts.encoder

    def reopened(self) -> Searcher:
        """A searcher over the folder's current generation, with this one's options; the loaded query encoder and
        cross-encoders carry over when the new generation was built by the same model."""
        old = self.parts.loaded_encoder
        new_index = open_index(self.index.folder)
        same = old is not None and new_index.manifest.dense is not None \
            and new_index.manifest.dense.model.hash == old.model_hash
        before = self.parts
        after = IndexParts(new_index)
        if after.corpus_sha256 != before.corpus_sha256 and after.dense_model_hash == before.dense_model_hash:
            for reranker in self._rerankers.values():  # documents added or deleted: the check made before carries
                check = reranker.find_check(before.corpus_sha256, before.dense_model_hash)
                if check is not None:
                    reranker.adopt(replace(check, corpus_sha256=after.corpus_sha256))
        # a check stored beside the index for the new corpus wins (adopted as the new searcher opens)
        return Searcher(new_index, *self._options, query_encoder=old if same else None, rerankers=self._rerankers)

    def reranker(self, model: str) -> CrossEncoderReranker:
        """The cross-encoder in folder ``model``, loaded once (with the check stored beside the index for this
        corpus, where there is one)."""
        if model not in self._rerankers:
            options = {**self._rerank.__dict__, "model": model} if self._rerank else {"model": model}
            self._rerankers[model] = CrossEncoderReranker(RerankConfig(**options))
            self._adopt_stored_check(self._rerankers[model])
        return self._rerankers[model]

    def check_applies(self, reranker: CrossEncoderReranker) -> bool:
        """Whether ``reranker``'s corpus check applies on this index (trained on another corpus, a dense part to
        check its first stage with): one explicit step, ``retr.eval.pseudo.check_index_reranker``, reads the check
        stored beside the index or in the cache, else measures it, and stores it beside the index."""
        return self.parts.dense_model_hash is not None and reranker.needs_check(self.parts.corpus_sha256)

    def check_key(self, reranker: CrossEncoderReranker) -> str | None:
        """The key of ``reranker``'s check on this generation's corpus and dense model (None: no dense part)."""
        parts = self.parts
        if parts.dense_model_hash is None:
            return None
        return reranker.check_key(parts.corpus_sha256, parts.dense_model_hash)

    def _adopt_stored_check(self, reranker: CrossEncoderReranker) -> None:
        """Use the check stored beside the index (``CorpusCheck.save_beside``) for this corpus, where one is."""
        key, parts = self.check_key(reranker), self.parts
        if key is None or not reranker.needs_check(parts.corpus_sha256):
            return
        check = CorpusCheck.load_beside(self.index.folder, key, parts.corpus_sha256, reranker.model_hash,
                                        parts.dense_model_hash)
        if check is not None:
            reranker.adopt(check)

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

    def config_for(self, request: SearchRequest) -> PipelineConfig:
        """The pipeline options of ``request``: the searcher's, with those it gives (a request's option named as a
        ``PipelineConfig`` field: fusion, fusion depth, passage aggregate) in their place."""
        given = {f.name: getattr(request, f.name, None) for f in fields(self.config)}
        return replace(self.config, **{name: value for name, value in given.items() if value is not None})

    def retriever(self, pipeline: Pipeline, config: PipelineConfig | None = None, rerank: str | None = None,
                  allowed: np.ndarray | None = None) -> Retriever:
        """The retriever of ``pipeline`` over this index (``retr.retrieval.compose.build``): what a search runs
        and what `retr eval` times. ``rerank``: the cross-encoder folder of its rerank stage; ``allowed``: the
        positions a filter leaves (``allowed``)."""
        with self._lock:  # lazy parts (encoder, its query graph, BM25, cross-encoder) are made once
            retriever = build(pipeline, self.parts, config or self.config,
                              self.reranker(rerank) if rerank else None, allowed)
            if "dense" in pipeline.needs:
                _ = self.parts.encoder.query_graph
        return retriever

    def run(self, request: SearchRequest) -> list[SearchResult]:
        """One result per query of ``request`` (``retr.retrieval.request``: checked, with the one set of
        defaults), each searched alone: a query's hits never depend on the others. ``request.filter``: every
        stage searches only the documents whose record holds it, so k hits come back whenever k such exist."""
        timer = StageTimer()
        t0 = time.perf_counter()
        run = self.search_run(request, timer=timer)  # checks the request and that the searcher is open
        share = 1000.0 / len(request.queries)  # a batch's time, per query
        latency = {**{s: v * share for s, v in timer.seconds.items()}, "total": (time.perf_counter() - t0) * share}
        out = []
        for i, q in enumerate(request.queries):
            hits = run[str(i)]
            docs = [self.index.docstore.get(self._positions[h.doc_id]) for h in hits]
            out.append(SearchResult(
                query=q, pipeline=str(request.pipeline), k=request.k,
                hits=[SearchHit(r, h.doc_id, h.score, d.title, d.text, dict(d.metadata))
                      for r, (h, d) in enumerate(zip(hits, docs, strict=True), start=1)],
                latency_ms=dict(latency)))
        return out

    def search_run(self, request: SearchRequest, ids: Sequence[str] | None = None, chunk: int = BATCH,
                   progress: Callable[[int], None] | None = None, timer: StageTimer | None = None) -> Run:
        """The ``Run`` of ``request``'s queries (keyed by ``ids``, default their positions "0", "1", ...): the one
        path of a single search, ``Index.search_batch``, the service's batch and `retr search --topics`.

        Queries go to the pipeline ``chunk`` at a time: a dense stage encodes a chunk (queries of one token
        length) in one batch and FAISS searches its vectors together (OpenMP threads over the queries); BM25
        spreads a chunk's queries over threads. Each query is still ranked alone: its hits and scores are the
        ones it gets searched by itself.
        ``progress(n)``: called after each chunk with the queries done in it."""
        if not isinstance(request, SearchRequest):
            raise RetrError(f"a search takes a SearchRequest, got {type(request).__name__}")
        if self._closed:
            raise RetrError(f"{self.index.folder}: this index was closed: open it again to search")
        ids = [str(i) for i in range(len(request.queries))] if ids is None else [str(i) for i in ids]
        if len(ids) != len(request.queries) or len(set(ids)) != len(ids):
            raise RetrError(f"a batch needs one distinct id per query: {len(ids)} ids for {len(request.queries)} "
                            f"queries")
        with self._lock:
            allowed = self.allowed(request.filter)
        retriever = self.retriever(request.pipeline, self.config_for(request), request.rerank, allowed)
        timer = timer if timer is not None else StageTimer()
        rankings: dict = {}
        dense = "dense" in request.pipeline.needs
        for part in _chunks(ids, request.queries, max(1, chunk), self.parts.encoder if dense else None):
            found = retriever.search(part, request.k, timer)
            rankings.update((qid, found[qid]) for qid in part)
            if progress is not None:
                progress(len(part))
        return Run({qid: rankings[qid] for qid in ids})

    @with_options
    def search_many(self, queries: Sequence[str], **options) -> list[SearchResult]:
        """``run`` of ``SearchRequest.batch(queries, ...)``: one result per query."""
        return self.run(SearchRequest.batch(queries, **options))

    @with_options
    def search(self, query: str, **options) -> SearchResult:
        """``run`` of ``SearchRequest.one(query, ...)``: its one result."""
        return self.run(SearchRequest.one(query, **options))[0]

    def document(self, doc_id: str):
        """The stored document ``doc_id``, or None when the index does not hold it."""
        position = self._positions.get(doc_id)
        return None if position is None else self.index.docstore.get(position)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the index's files; searching afterwards is a one-line error (closing twice is harmless)."""
        if not self._closed:
            self._closed = True
            self.index.close()
