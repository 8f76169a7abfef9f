"""The one builder: a pipeline value (``retr.retrieval.pipeline.Pipeline``) made into a retriever over an index.

``IndexParts`` holds what every pipeline over one index shares, each made the first time a stage needs it: the
query encoder (resolved from the index's manifest), BM25, the passage maps, the position of each id. ``build``
walks the value and asks each node's registered stage (``retr.retrieval.stages``) for its retriever. The
searcher (`retr search`, the API, `retr serve`), `retr eval` and the reranker check all build through it.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

from retr.retrieval.bm25 import BM25Retriever
from retr.retrieval.dense import DenseRetriever, check_dimension, check_model, check_prompts
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.models import ModelRef
from retr.retrieval.passages import PassageMap
from retr.retrieval.pipeline import Pipeline, PipelineConfig
from retr.retrieval.protocol import Retriever
from retr.retrieval.rerank import CrossEncoderReranker, RerankWeight
from retr.retrieval.shards import Merged, ShardedDense, split_positions
from retr.retrieval.sparse import SparseRetriever, sparse_encoder_for
from retr.retrieval.stage import Context

_DEFAULT_ENCODER = EncoderConfig()


def encoder_for_index(index, config: EncoderConfig = _DEFAULT_ENCODER) -> BiEncoder:
    """The query encoder for ``index``: ``config.model`` if given, else the model recorded in its manifest; its
    prompts are the index's unless given.
    The model's identity is checked against the index before any graph is loaded or exported."""
    built = index.dense_info["model"]
    chosen = config.model is not None
    model = config.model
    if not chosen:
        model = built["path"] if built.get("path") and Path(built["path"]).is_dir() else built["id"]
    ref = ModelRef.resolve(model)
    check_model(index.folder, index.dense_info, ref, chosen)
    # prompts: the ones the index was built with, unless given (a query prompt given must be the index's)
    recorded = built.get("prompts") or {}
    config = replace(config, query_prompt=recorded.get("query", "") if config.query_prompt is None else config.query_prompt,
                     doc_prompt=recorded.get("document", "") if config.doc_prompt is None else config.doc_prompt)
    encoder = BiEncoder(replace(config, model=model, max_length=config.max_length or built.get("max_length")), ref)
    check_dimension(index.folder, index.dense_info, encoder)
    check_prompts(index.folder, index.dense_info, encoder)
    return encoder


class IndexParts:
    """One index's shared parts, each made once when first needed (not thread-safe while making: the searcher
    builds under its lock). ``encoder``: a query encoder already made for this index (e.g. the previous
    generation's), else one is resolved from ``encoder_config`` and the manifest when a dense stage needs it."""

    def __init__(self, index, encoder: BiEncoder | None = None, encoder_config: EncoderConfig = _DEFAULT_ENCODER):
        self.index = index
        self.encoder_config = encoder_config
        self._encoder = encoder
        self._bm25: BM25Retriever | list[BM25Retriever] | None = None
        self._sparse: dict[str, SparseRetriever] = {}  # engine -> the splade stage (one encoder, one matrix)
        self._passages: dict[tuple, PassageMap | None] = {}  # (aggregate, shard) -> map
        self._made: dict[tuple, object] = {}  # what a stage made once for this index (``once``)

    @property
    def encoder(self) -> BiEncoder:
        if self._encoder is None:
            self._encoder = encoder_for_index(self.index, self.encoder_config)
        return self._encoder

    @property
    def loaded_encoder(self) -> BiEncoder | None:
        """The query encoder if one was made (or given), else None: nothing is loaded to answer."""
        return self._encoder

    @property
    def corpus_sha256(self) -> str:
        """The checksum of the corpus the index was built from (its manifest's schema requires it on open)."""
        return self.index.manifest.corpus.sha256

    @property
    def dense_model_hash(self) -> str | None:
        """The hash of the model that encoded the index's documents (None: an index without a dense part)."""
        dense = self.index.manifest.dense
        return dense.model.hash if dense is not None else None

    def rerank_weight(self, reranker: CrossEncoderReranker) -> RerankWeight:
        """``reranker``'s interpolation weight on this index's corpus (``CrossEncoderReranker.weight_for``)."""
        return reranker.weight_for(self.corpus_sha256, self.dense_model_hash)

    def once(self, key: tuple, make):
        """``make()``, made once per ``key`` for this index (a stage's model or cached part)."""
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    @property
    def docstore(self):
        return self.index.docstore

    @functools.cached_property
    def positions(self) -> dict[str, int]:
        return {d: i for i, d in enumerate(self.index.ids)}

    @property
    def _shards(self):
        return getattr(self.index, "shards", None)  # a sharded index: each shard's own parts, searched and merged

    def passages(self, aggregate: str | None = None) -> PassageMap | None:
        """The index's passage map with ``aggregate`` (None: the index's own); None for an index of whole
        documents. Made once per aggregate: a map keeps its row tables for every search."""
        return self._aggregated(aggregate, None)

    def _aggregated(self, aggregate: str | None, shard: int | None) -> PassageMap | None:
        key = (aggregate, shard)
        if key not in self._passages:
            source = self.index if shard is None else self._shards[shard]
            found = getattr(source, "passages", None)
            self._passages[key] = found.with_aggregate(aggregate) if found is not None and aggregate else found
        return self._passages[key]

    def dense(self, allowed=None, aggregate: str | None = None) -> Retriever:
        shards = self._shards
        if shards is None:
            return DenseRetriever(self.index.faiss_index, self.index.ids, self.encoder, allowed,
                                  self.passages(aggregate))
        return ShardedDense([DenseRetriever(s.faiss_index, s.ids, self.encoder, part, self._aggregated(aggregate, i))
                             for i, (s, part) in enumerate(zip(shards, split_positions(allowed, self.index.offsets),
                                                               strict=True))])

    def bm25(self, allowed=None) -> Retriever:
        if self._bm25 is None:
            shards = self._shards
            self._bm25 = ([BM25Retriever(s.bm25_folder, s.ids) for s in shards] if shards is not None
                          else BM25Retriever(self.index.bm25_folder, self.index.ids))
        if isinstance(self._bm25, list):
            return Merged([r.restricted(part) for r, part in
                           zip(self._bm25, split_positions(allowed, self.index.offsets), strict=True)])
        return self._bm25.restricted(allowed)

    def sparse(self, allowed=None, engine: str = "exact") -> Retriever:
        """The learned sparse stage over the index's ``sparse/`` part, its query encoder the one that built it."""
        if engine not in self._sparse:
            if self._shards is not None:
                raise RetrError(f"{self.index.folder}: a sharded index has no sparse part: build it unsharded with "
                                f"--sparse-model")
            info = self.index.manifest.sparse
            if info is None:
                raise RetrError(f"{self.index.folder}: this index has no sparse part: rebuild it with "
                                f"`retr index --sparse-model MODEL`")
            made = next(iter(self._sparse.values()), None)  # another engine's: the same encoder and rows
            encoder = made.encoder if made is not None else sparse_encoder_for(self.index.folder, info.model)
            matrix = made.matrix if made is not None else self.index.sparse_matrix
            self._sparse[engine] = SparseRetriever(matrix, self.index.ids, encoder, engine=engine)
        return self._sparse[engine].restricted(allowed)

def build(pipeline: Pipeline, parts: IndexParts, config: PipelineConfig | None = None,
          reranker: CrossEncoderReranker | None = None, allowed=None) -> Retriever:
    """The retriever of ``pipeline`` over ``parts``' index: ``config`` the options the value leaves open,
    ``reranker`` the cross-encoder of its ``rerank`` stage, ``allowed`` the only document positions any stage may
    return (sorted int64; a metadata filter), None for all."""
    context = Context(parts, config or PipelineConfig(), reranker, allowed)

    def made(node: Pipeline) -> Retriever:
        return node.declaration.build(context, node, [made(p) for p in node.inputs])

    return made(pipeline)
