"""Build an index folder atomically: manifest + FAISS file + id list + doc store (+ BM25)."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from retr.indexes.atomic import atomic_dir
from retr.indexes.cache import EmbeddingCache, embedding_key
from retr.indexes.dense import FAISS_FILE, DenseIndexConfig, build_faiss, save_faiss
from retr.indexes.docstore import write_docstore
from retr.indexes.manifest import new_manifest, write_manifest
from retr.retrieval.bm25 import BM25_DIR, BM25Config, build_bm25
from retr.retrieval.encoder import BiEncoder, EncoderConfig

logger = logging.getLogger(__name__)

INDEX_KIND = "retr-index"


@dataclass(frozen=True)
class IndexConfig:
    dense: DenseIndexConfig = field(default_factory=DenseIndexConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    bm25: BM25Config | None = None
    use_cache: bool = True


def corpus_embeddings(encoder: BiEncoder, corpus, use_cache: bool = True,
                      cache: EmbeddingCache | None = None) -> tuple[np.ndarray, dict]:
    """Embeddings of ``corpus`` from the cache, or encoded (and then cached)."""
    cache = cache or EmbeddingCache()
    key = embedding_key(encoder.model_hash, corpus.sha256, encoder.max_length, encoder.backend)
    if use_cache:
        hit = cache.load(key, len(corpus), encoder.dim)
        if hit is not None:
            return hit[0], {"cached": True, "cache_key": key, "encode_seconds": 0.0,
                            "graph": hit[1].get("graph")}
    logger.info("encoding %d documents with %s (max length %d, %s backend)", len(corpus), encoder.model_id,
                encoder.max_length, encoder.backend)
    t0 = time.perf_counter()
    emb = encoder.encode_corpus([d.full_text() for d in corpus.docs], show_progress=True)
    seconds = time.perf_counter() - t0
    if use_cache:
        cache.save(key, emb, {"model": encoder.model_id, "model_hash": encoder.model_hash, "backend": encoder.backend,
                              "corpus_sha256": corpus.sha256, "max_length": encoder.max_length,
                              "encode_seconds": seconds, "graph": encoder.corpus_graph})
    # seconds include a first calibration of the corpus graph (openvino-int8), once per model and corpus
    return emb, {"cached": False, "cache_key": key, "encode_seconds": seconds, "graph": encoder.corpus_graph,
                 "docs_per_second": len(corpus) / seconds if seconds > 0 else None}


def build_index(corpus, out: Path, cfg: IndexConfig = IndexConfig(), encoder: BiEncoder | None = None,
                cache: EmbeddingCache | None = None) -> dict:
    """Write the index for ``corpus`` to ``out``. A failure leaves no ``out`` (or the old one)."""
    out = Path(out)
    encoder = encoder or BiEncoder(cfg.encoder)
    with atomic_dir(out) as tmp:
        t_all = time.perf_counter()
        write_docstore(tmp, corpus.docs)
        emb, enc_info = corpus_embeddings(encoder, corpus, cfg.use_cache, cache)
        t0 = time.perf_counter()
        index, params = build_faiss(emb, cfg.dense)
        faiss_seconds = time.perf_counter() - t0
        faiss_bytes = save_faiss(index, tmp / FAISS_FILE)
        dense = {
            "kind": cfg.dense.kind, "metric": "inner_product", "normalized": True, "params": params,
            "file": FAISS_FILE, "dim": encoder.dim, "model": encoder.describe(),
            "encode": enc_info, "faiss_build_seconds": faiss_seconds,
            "build_seconds": enc_info["encode_seconds"] + faiss_seconds, "bytes": faiss_bytes,
            "docs_per_second": (len(corpus) / (enc_info["encode_seconds"] + faiss_seconds)),
        }
        bm25 = None
        if cfg.bm25 is not None:
            bm25 = build_bm25([d.full_text() for d in corpus.docs], tmp / BM25_DIR, cfg.bm25)
            bm25["dir"] = BM25_DIR
            bm25["docs_per_second"] = len(corpus) / bm25["build_seconds"]
        manifest = new_manifest(
            INDEX_KIND,
            num_docs=len(corpus),
            corpus={"source": str(corpus.source), "sha256": corpus.sha256, "num_docs": len(corpus),
                    "empty_docs": corpus.empty_docs},
            dense=dense,
            bm25=bm25,
            build_seconds=time.perf_counter() - t_all,
            config=asdict(cfg),
        )
        write_manifest(tmp, manifest)
    logger.info("index written to %s (%d docs, %s%s)", out, len(corpus), cfg.dense.kind, " + bm25" if bm25 else "")
    return manifest
