"""Named pipelines (bm25, dense, splade, hybrid = dense + bm25, hybrid3 = dense + bm25 + splade, each optionally
+rerank) composed over one index folder.

A pipeline name is parsed once into a ``PipelineSpec``; everything else (which parts of an index it needs, which
stages it times, which build costs it carries) asks the spec.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

from retr.retrieval import defaults
from retr.retrieval.bm25 import BM25Retriever
from retr.retrieval.dense import DenseRetriever, check_dimension, check_model, check_prompts
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.fusion import DEFAULT_FUSION, FUSIONS, HybridRetriever
from retr.retrieval.models import ModelRef
from retr.retrieval.passages import AGGREGATES, PassageMap
from retr.retrieval.protocol import Retriever
from retr.retrieval.rerank import CrossEncoderReranker, RerankRetriever, RerankWeight
from retr.retrieval.shards import Merged, ShardedDense, split_positions
from retr.retrieval.sparse import ENGINES, SparseRetriever, sparse_encoder_for

FIRST_STAGES = ("bm25", "dense", "hybrid", "splade", "hybrid3")
RERANK_SUFFIX = "+rerank"
PIPELINES = (*FIRST_STAGES, *(f"{b}{RERANK_SUFFIX}" for b in ("dense", "hybrid", "bm25", "splade", "hybrid3")))


@dataclass(frozen=True)
class PipelineSpec:
    first: str  # one of FIRST_STAGES
    rerank: bool = False

    @classmethod
    def parse(cls, name: str) -> PipelineSpec:
        base, plus, rest = name.strip().partition("+")
        if base not in FIRST_STAGES or (plus and rest != RERANK_SUFFIX[1:]):
            raise RetrError(f"unknown pipeline {name!r}: choose from {', '.join(PIPELINES)}")
        return cls(base, bool(plus))

    @property
    def name(self) -> str:
        return self.first + (RERANK_SUFFIX if self.rerank else "")

    @property
    def uses_dense(self) -> bool:
        return self.first in ("dense", "hybrid", "hybrid3")

    @property
    def uses_bm25(self) -> bool:
        return self.first in ("bm25", "hybrid", "hybrid3")

    @property
    def uses_sparse(self) -> bool:
        return self.first in ("splade", "hybrid3")


def parse_pipelines(spec: str) -> tuple[PipelineSpec, ...]:
    """``"bm25,dense,hybrid+rerank"`` -> specs, duplicates dropped, order kept."""
    names = [p.strip() for p in spec.split(",") if p.strip()]
    if not names:
        raise RetrError(f"no pipeline given: choose from {', '.join(PIPELINES)}")
    return tuple(dict.fromkeys(PipelineSpec.parse(n) for n in names))


@dataclass(frozen=True)
class PipelineConfig:
    fusion: str = DEFAULT_FUSION
    fusion_depth: int = defaults.FUSION_DEPTH
    rrf_k: int = 60
    passage_aggregate: str | None = None  # an index of passages: None takes the one it was built with
    sparse_engine: str = "exact"  # how the splade stage searches: exact (CSR dot products) | seismic (approximate)

    def __post_init__(self) -> None:
        if self.sparse_engine not in ENGINES:
            raise RetrError(f"unknown sparse engine {self.sparse_engine!r}: choose one of {', '.join(ENGINES)}")
        if self.fusion not in FUSIONS:
            raise RetrError(f"unknown fusion {self.fusion!r}: choose one of {', '.join(FUSIONS)}")
        if self.passage_aggregate is not None and self.passage_aggregate not in AGGREGATES:
            raise RetrError(f"unknown passage aggregate {self.passage_aggregate!r}: choose one of "
                            f"{', '.join(AGGREGATES)}")


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


class PipelineFactory:
    """Builds retrievers by spec, sharing one encoder, one BM25 and one reranker between them."""

    def __init__(self, index, encoder: BiEncoder | None = None, reranker: CrossEncoderReranker | None = None,
                 config: PipelineConfig = PipelineConfig(), encoder_config: EncoderConfig = _DEFAULT_ENCODER):
        self.index = index
        self._encoder = encoder
        self.reranker = reranker
        self.config = config
        self.encoder_config = encoder_config  # how the encoder is made when none is given and one is needed
        self._bm25: BM25Retriever | list[BM25Retriever] | None = None
        self._sparse: SparseRetriever | None = None
        self._positions: dict[str, int] | None = None

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

    @property
    def encoder(self) -> BiEncoder:
        if self._encoder is None:
            self._encoder = encoder_for_index(self.index, self.encoder_config)
        return self._encoder

    def _aggregated(self, found: PassageMap | None) -> PassageMap | None:
        if found is not None and self.config.passage_aggregate:
            return found.with_aggregate(self.config.passage_aggregate)
        return found

    @functools.cached_property
    def passages(self) -> PassageMap | None:
        return self._aggregated(getattr(self.index, "passages", None))

    @functools.cached_property
    def _shard_passages(self) -> list[PassageMap | None]:
        """Each shard's passage map (made once: a map keeps its row tables for every search)."""
        return [self._aggregated(s.passages) for s in self._shards]

    @property
    def _shards(self):
        return getattr(self.index, "shards", None)  # a sharded index: each shard's own parts, searched and merged

    def dense(self, allowed=None) -> Retriever:
        shards = self._shards
        if shards is None:
            return DenseRetriever(self.index.faiss_index, self.index.ids, self.encoder, allowed, self.passages)
        return ShardedDense([DenseRetriever(s.faiss_index, s.ids, self.encoder, part, passages)
                             for s, part, passages in zip(shards, split_positions(allowed, self.index.offsets),
                                                          self._shard_passages, strict=True)])

    def bm25(self, allowed=None) -> Retriever:
        if self._bm25 is None:
            shards = self._shards
            self._bm25 = ([BM25Retriever(s.bm25_folder, s.ids) for s in shards] if shards is not None
                          else BM25Retriever(self.index.bm25_folder, self.index.ids))
        if isinstance(self._bm25, list):
            return Merged([r.restricted(part) for r, part in
                           zip(self._bm25, split_positions(allowed, self.index.offsets), strict=True)])
        return self._bm25.restricted(allowed)

    def sparse(self, allowed=None) -> Retriever:
        """The learned sparse stage over the index's ``sparse/`` part, its query encoder the one it was built with."""
        if self._sparse is None:
            if self._shards is not None:
                raise RetrError(f"{self.index.folder}: a sharded index has no sparse part: build it unsharded with "
                                f"--sparse-model")
            info = self.index.manifest.sparse
            if info is None:
                raise RetrError(f"{self.index.folder}: this index has no sparse part: rebuild it with "
                                f"`retr index --sparse-model MODEL`")
            encoder = sparse_encoder_for(self.index.folder, info.model, self.config.sparse_engine)
            self._sparse = SparseRetriever(self.index.sparse_matrix, self.index.ids, encoder)
        return self._sparse.restricted(allowed)

    def make(self, spec: PipelineSpec | str, reranker: CrossEncoderReranker | None = None,
             allowed=None) -> Retriever:
        """The retriever for ``spec``; ``reranker`` (else the factory's) for a +rerank pipeline; ``allowed``: the
        only document positions any stage may return (sorted int64; a metadata filter), None for all."""
        spec = PipelineSpec.parse(spec) if isinstance(spec, str) else spec
        reranker = reranker or self.reranker
        if spec.first == "dense":
            first: Retriever = self.dense(allowed)
        elif spec.first == "bm25":
            first = self.bm25(allowed)
        elif spec.first == "splade":
            first = self.sparse(allowed)
        else:
            more = (self.sparse(allowed),) if spec.first == "hybrid3" else ()
            first = HybridRetriever(self.dense(allowed), self.bm25(allowed), self.config.fusion, self.config.fusion_depth,
                                    self.config.rrf_k, more=more, name=spec.first)
        if not spec.rerank:
            return first
        if reranker is None:
            raise RetrError(f"pipeline {spec.name!r} needs a cross-encoder: pass --rerank DIR")
        if self._positions is None:
            self._positions = {d: i for i, d in enumerate(self.index.ids)}
        return RerankRetriever(first, reranker, self.index.docstore, self._positions, self.passages,
                               self.rerank_weight(reranker))
