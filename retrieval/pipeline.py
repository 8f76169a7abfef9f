"""Compose named pipelines (bm25, dense, hybrid, +rerank) over one index folder."""

from __future__ import annotations

from dataclasses import dataclass

from retr.retrieval.bm25 import BM25Retriever
from retr.retrieval.dense import DenseRetriever, check_encoder
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.fusion import HybridRetriever
from retr.retrieval.protocol import Retriever
from retr.retrieval.rerank import CrossEncoderReranker, RerankRetriever

PIPELINES = ("bm25", "dense", "hybrid", "dense+rerank", "hybrid+rerank", "bm25+rerank")


@dataclass(frozen=True)
class PipelineConfig:
    fusion: str = "rrf"
    fusion_depth: int = 100
    rrf_k: int = 60
    rerank_depth: int = 100


def parse_pipelines(spec: str) -> list[str]:
    names = [p.strip() for p in spec.split(",") if p.strip()]
    bad = [p for p in names if p not in PIPELINES]
    if bad or not names:
        raise RetrError(f"unknown pipeline(s) {', '.join(bad) or '(none)'}: choose from {', '.join(PIPELINES)}")
    return list(dict.fromkeys(names))


def encoder_for_index(index, model: str | None = None, max_length: int | None = None,
                      backend: str = "onnx", query_backend: str | None = None) -> BiEncoder:
    """The query encoder for ``index``: ``model`` if given, else the model recorded in its manifest."""
    built = index.dense_info["model"]
    if model is None:
        model = built["path"] if built.get("path") else built["id"]
        from pathlib import Path

        if built.get("path") and not Path(built["path"]).is_dir():
            model = built["id"]
    encoder = BiEncoder(EncoderConfig(model=model, max_length=max_length or built.get("max_length"), backend=backend,
                                      query_backend=query_backend))
    check_encoder(index.folder, index.dense_info, encoder)
    return encoder


class PipelineFactory:
    """Builds retrievers by name, sharing one encoder, one BM25 and one reranker between them."""

    def __init__(self, index, encoder: BiEncoder | None = None, reranker: CrossEncoderReranker | None = None,
                 config: PipelineConfig = PipelineConfig()):
        self.index = index
        self._encoder = encoder
        self.reranker = reranker
        self.config = config
        self._bm25: BM25Retriever | None = None
        self._positions: dict[str, int] | None = None

    @property
    def encoder(self) -> BiEncoder:
        if self._encoder is None:
            self._encoder = encoder_for_index(self.index)
        return self._encoder

    def dense(self) -> DenseRetriever:
        return DenseRetriever(self.index.faiss_index, self.index.ids, self.encoder)

    def bm25(self) -> BM25Retriever:
        if self._bm25 is None:
            self._bm25 = BM25Retriever(self.index.bm25_folder, self.index.ids)
        return self._bm25

    def make(self, name: str) -> Retriever:
        base, _, rerank = name.partition("+")
        if base == "dense":
            first: Retriever = self.dense()
        elif base == "bm25":
            first = self.bm25()
        elif base == "hybrid":
            first = HybridRetriever(self.dense(), self.bm25(), self.config.fusion, self.config.fusion_depth,
                                    self.config.rrf_k)
        else:
            raise RetrError(f"unknown pipeline {name!r}: choose from {', '.join(PIPELINES)}")
        if not rerank:
            return first
        if rerank != "rerank":
            raise RetrError(f"unknown pipeline {name!r}: choose from {', '.join(PIPELINES)}")
        if self.reranker is None:
            raise RetrError(f"pipeline {name!r} needs a cross-encoder: pass --reranker DIR")
        if self._positions is None:
            self._positions = {d: i for i, d in enumerate(self.index.ids)}
        return RerankRetriever(first, self.reranker, self.index.docstore, self._positions, self.config.rerank_depth)
