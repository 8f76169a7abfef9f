"""Build an index folder atomically: manifest + FAISS file + id list + doc store (+ BM25).

An existing ``out`` is replaced only when it is a retr index folder (or empty); anything else, the corpus
itself, a folder holding it or a BEIR folder's inside are refused. One writer at a time (a lock beside ``out``);
what a killed build left is removed by the next build of the same ``out``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from retr.indexes.bm25 import build_bm25
from retr.indexes.cache import EmbeddingCache, embedding_key
from retr.indexes.corpus import Corpus
from retr.indexes.dense import (
    FAISS_FILE,
    LOSSY_KINDS,
    VECTORS_FILE,
    DenseIndexConfig,
    build_faiss,
    save_faiss,
)
from retr.indexes.docstore import write_docstore
from retr.indexes.folder import INDEX_KIND, IndexFolder
from retr.indexes.manifest import is_index_folder, write_manifest
from retr.retrieval.artifacts import atomic_dir, cache_home, checksums, new_manifest, writer_lock
from retr.retrieval.bm25 import BM25_DIR, BM25Config
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.passages import PassageConfig, Passages, split_passages

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IndexConfig:
    dense: DenseIndexConfig = field(default_factory=DenseIndexConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    bm25: BM25Config | None = None
    use_cache: bool = True
    passages: PassageConfig | None = None  # None: one vector per document (cut at the encoder's max length)


PASSAGE_DOCS_FILE = "passage_docs.npy"  # (p,) int32: each vector row's document
PASSAGE_SPANS_FILE = "passage_spans.npy"  # (p, 2) int64: each passage's character span in its document's body
TRUNCATION_WARN_SHARE = 0.05  # warn when the encoder never sees more than this share of the corpus's tokens


@dataclass(frozen=True)
class IndexTexts:
    """The texts that get one vector each: the documents, or their passages."""
    texts: list[str]
    sha256: str  # their identity in the embedding cache
    passages: Passages | None = None


def index_texts(encoder: BiEncoder, corpus: Corpus, passages: PassageConfig | None) -> IndexTexts:
    docs = corpus.docs
    if passages is None:
        return IndexTexts([d.full_text() for d in docs], corpus.sha256)
    room = encoder.max_length - int(encoder.token_counts([encoder.prompts.document or ""])[0])
    if passages.size > room:
        raise RetrError(f"--passages {passages.size}: longer than the encoder takes ({encoder.max_length} tokens, "
                        f"{encoder.max_length - room} of them special tokens and prompt): give at most {room}, or "
                        f"a larger --max-length")
    t0 = time.perf_counter()
    split = split_passages([d.title.strip() for d in docs], [d.text for d in docs], passages, encoder.token_offsets,
                           lambda texts: encoder.token_counts(texts, special=False).tolist())
    logger.info("split %d documents into %d passages of <= %d tokens (stride %d) in %.1f s", len(docs),
                len(split.texts), passages.size, passages.stride, time.perf_counter() - t0)
    key = hashlib.sha256(f"{corpus.sha256}|passages={passages.size}:{passages.stride}".encode()).hexdigest()
    return IndexTexts(split.texts, key, split)


def truncation_report(encoder: BiEncoder, texts: list[str], what: str) -> dict:
    """How much the encoder cuts off ``texts``; a warning when it is a large share."""
    t = encoder.truncation(texts)
    if t["share_tokens_dropped"] > TRUNCATION_WARN_SHARE:
        logger.warning("%d of %d %s (%.0f%%) are longer than the encoder's %d tokens: %.0f%% of the corpus's tokens "
                       "are never seen by the dense side; index with --passages N[:STRIDE] to keep them", t["truncated"],
                       t["texts"], what, 100 * t["share_truncated"], t["max_length"], 100 * t["share_tokens_dropped"])
    return t


def corpus_embeddings(encoder: BiEncoder, corpus: Corpus, use_cache: bool = True,
                      cache: EmbeddingCache | None = None, texts: IndexTexts | None = None) -> tuple[np.ndarray, dict]:
    """Embeddings of ``corpus`` (or of ``texts`` made from it: its passages) from the cache, or encoded (and then
    cached)."""
    cache = cache or EmbeddingCache()
    texts = texts or IndexTexts([d.full_text() for d in corpus.docs], corpus.sha256)
    key = embedding_key(encoder.model_hash, texts.sha256, encoder.max_length, encoder.backend,
                        encoder.prompts.document)
    if use_cache:
        hit = cache.load(key, len(texts.texts), encoder.dim)
        if hit is not None:
            return hit[0], {"cached": True, "cache_key": key, "encode_seconds": 0.0, "graph": hit[1].get("graph")}
    logger.info("encoding %d %s with %s (max length %d, %s backend)", len(texts.texts),
                "passages" if texts.passages else "documents", encoder.model_id, encoder.max_length, encoder.backend)
    t0 = time.perf_counter()
    encoded = encoder.encode_corpus(texts.texts, show_progress=True)
    seconds = time.perf_counter() - t0
    if use_cache:
        cache.save(key, encoded.embeddings, {
            "model": encoder.model_id, "model_hash": encoder.model_hash, "backend": encoder.backend,
            "corpus_sha256": texts.sha256, "max_length": encoder.max_length, "encode_seconds": seconds,
            "doc_prompt": encoder.prompts.document,
            "graph": encoded.graph})
    # seconds include a first calibration of the corpus graph (openvino-int8), once per model and corpus
    return encoded.embeddings, {"cached": False, "cache_key": key, "encode_seconds": seconds, "graph": encoded.graph,
                                "docs_per_second": len(corpus) / seconds if seconds > 0 else None,
                                "texts_per_second": len(texts.texts) / seconds if seconds > 0 else None}


def keep_vectors(emb: np.ndarray, cfg: DenseIndexConfig, folder: Path) -> dict:
    """Keep the full vectors beside a lossy index (so that it can change and compact); the manifest's entry."""
    if cfg.kind not in LOSSY_KINDS:
        return {}
    np.save(folder / VECTORS_FILE, np.ascontiguousarray(emb, dtype=np.float32))
    return {"vectors": VECTORS_FILE}


def check_out(out: Path, corpus: Corpus) -> None:
    """Refuse an ``out`` whose replacement would destroy anything but an older retr index."""
    out = Path(out).absolute().resolve()
    source = Path(corpus.source).absolute().resolve()
    if out == source or source.is_relative_to(out):
        raise RetrError(f"{out}: holds the corpus being indexed ({source}): choose another --out")
    beir_folder = source.parent
    if ((beir_folder / "queries.jsonl").is_file() or (beir_folder / "qrels").is_dir()) \
            and out.is_relative_to(beir_folder):
        raise RetrError(f"{out}: inside the dataset folder {beir_folder}: write the index elsewhere")
    if not out.exists():
        return
    if not out.is_dir():
        raise RetrError(f"{out}: exists and is not a folder: refusing to replace it; choose another --out")
    if any(out.iterdir()) and not is_index_folder(out, INDEX_KIND):
        raise RetrError(f"{out}: exists and is not a retr index folder (no retr manifest): refusing to replace it; "
                        f"choose another --out, or remove it yourself")


def build_index(corpus: Corpus, out: Path, cfg: IndexConfig = IndexConfig(), encoder: BiEncoder | None = None,
                cache: EmbeddingCache | None = None) -> dict:
    """Write the index for ``corpus`` to ``out``. A failure leaves no ``out`` (or the old one)."""
    out = Path(out)
    check_out(out, corpus)
    encoder = encoder or BiEncoder(cfg.encoder)
    with writer_lock(out), atomic_dir(out) as tmp:
        t_all = time.perf_counter()
        write_docstore(tmp, corpus.docs)
        texts = index_texts(encoder, corpus, cfg.passages)
        truncation = truncation_report(encoder, texts.texts, "passages" if texts.passages else "documents")
        emb, enc_info = corpus_embeddings(encoder, corpus, cfg.use_cache, cache, texts)
        t0 = time.perf_counter()
        index, params = build_faiss(emb, cfg.dense)
        faiss_seconds = time.perf_counter() - t0
        faiss_bytes = save_faiss(index, tmp / FAISS_FILE)
        dense_files = keep_vectors(emb, cfg.dense, tmp)
        passages = None
        if texts.passages is not None:
            np.save(tmp / PASSAGE_DOCS_FILE, texts.passages.docs)
            np.save(tmp / PASSAGE_SPANS_FILE, texts.passages.spans)
            per_doc = np.bincount(texts.passages.docs, minlength=len(corpus))
            passages = {**asdict(cfg.passages), "count": len(texts.texts), "docs_file": PASSAGE_DOCS_FILE,
                        "spans_file": PASSAGE_SPANS_FILE, "max_per_doc": int(per_doc.max()),
                        "mean_per_doc": float(per_doc.mean())}
        dense = {
            "kind": cfg.dense.kind, "metric": "inner_product", "normalized": True, "params": params,
            "file": FAISS_FILE, **dense_files, "dim": encoder.dim, "model": encoder.describe(),
            "passages": passages, "truncation": truncation,
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
                    "empty_docs": corpus.empty_docs, "fields": corpus.fields},
            dense=dense,
            bm25=bm25,
            build_seconds=time.perf_counter() - t_all,
            config=asdict(cfg),
            files=checksums(tmp),
        )
        write_manifest(tmp, manifest)
    logger.info("index written to %s (%d docs, %s%s)", out, len(corpus), cfg.dense.kind, " + bm25" if bm25 else "")
    return manifest


def cached_index(name: str, corpus: Corpus, encoder: BiEncoder, cfg: IndexConfig) -> IndexFolder:
    """The index (dense + BM25) of ``corpus`` from retr's cache, or built into it."""
    bm25 = cfg.bm25 or BM25Config()
    prompts = [encoder.prompts.to_dict()] if encoder.prompts.query or encoder.prompts.document else []
    passages = [asdict(cfg.passages)] if cfg.passages else []
    raw = json.dumps([corpus.sha256, encoder.model_hash, encoder.max_length, encoder.backend, asdict(cfg.dense),
                      asdict(bm25), *prompts, *passages], sort_keys=True)
    folder = cache_home() / "indexes" / f"{name}-{hashlib.sha256(raw.encode()).hexdigest()[:24]}"
    if cfg.use_cache and folder.is_dir():
        try:
            index = IndexFolder(folder)
            if index.manifest["corpus"]["sha256"] == corpus.sha256 and index.has_bm25:
                logger.info("index cache used: %s", folder)
                return index
        except RetrError as e:
            logger.warning("cached index %s unusable (%s): rebuilding", folder, e)
            shutil.rmtree(folder, ignore_errors=True)  # retr's own cache entry: a damaged manifest is no reason to keep it
    build_index(corpus, folder, IndexConfig(dense=cfg.dense, encoder=cfg.encoder, bm25=bm25, use_cache=cfg.use_cache,
                                            passages=cfg.passages), encoder=encoder)
    return IndexFolder(folder)
