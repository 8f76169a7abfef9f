"""Build an index folder atomically: manifest + FAISS file + id list + doc store (+ BM25).

A new ``out`` is written beside it and renamed into place (one rename: generation 0 at its root). An existing
index at ``out`` gets a new generation (``retr.indexes.generations``), published in one atomic step while its
readers keep the generation they opened; anything else, the corpus itself, a folder holding it or a BEIR
folder's inside are refused. One writer at a time (a lock beside ``out``); what a killed build left unfinished is
removed by the next build of the same ``out``, and nothing complete is.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from retr.indexes.bm25 import RowTokens, bm25_rows, build_bm25, index_bm25, write_bm25
from retr.indexes.cache import EmbeddingCache, embedding_key
from retr.indexes.corpus import Corpus
from retr.indexes.dense import DenseIndexConfig, build_faiss, save_dense
from retr.indexes.docstore import write_docstore
from retr.indexes.executors import EXECUTORS, ExecutorConfig
from retr.indexes.folder import INDEX_KIND
from retr.indexes.generations import collect, new_generation, recover_swap
from retr.indexes.manifest import INDEX_FORMAT_VERSION, is_index_folder, write_manifest
from retr.indexes.shards import SHARD_DIR, SHARD_PARTITION, SHARDED_KIND, open_index
from retr.indexes.sparse import SPARSE_DIR, encode_sparse, write_sparse
from retr.retrieval import defaults
from retr.retrieval.artifacts import MANIFEST, atomic_dir, cache_home, checksums, new_manifest, writer_lock
from retr.retrieval.bm25 import BM25_DIR, BM25Config
from retr.retrieval.encoder import BiEncoder, EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.passages import PassageConfig, Passages, split_passages
from retr.retrieval.sparse import SparseConfig, SparseEncoderModel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IndexConfig:
    dense: DenseIndexConfig = field(default_factory=DenseIndexConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    bm25: BM25Config | None = None
    use_cache: bool = defaults.USE_CACHE
    passages: PassageConfig | None = None  # None: one vector per document (cut at the encoder's max length)
    shards: int = defaults.SHARDS  # > 1: documents partitioned by a stable hash of their id into this many indexes
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)  # where the documents are encoded
    sparse: SparseConfig | None = None  # a learned sparse part (``sparse/``) beside the dense one

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise RetrError(f"--shards must be >= 1, got {self.shards}")
        if self.sparse is not None and self.shards > 1:
            raise RetrError("--sparse-model with --shards: a sharded index has no sparse part yet; build it unsharded")


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
    room = encoder.max_length - int(encoder.tokens.token_counts([encoder.prompts.document or ""])[0])
    if passages.size > room:
        raise RetrError(f"--passages {passages.size}: longer than the encoder takes ({encoder.max_length} tokens, "
                        f"{encoder.max_length - room} of them special tokens and prompt): give at most {room}, or "
                        f"a larger --max-length")
    t0 = time.perf_counter()
    split = split_passages([d.title.strip() for d in docs], [d.text for d in docs], passages, encoder.tokens.token_offsets,
                           lambda texts: encoder.tokens.token_counts(texts, special=False).tolist())
    logger.info("split %d documents into %d passages of <= %d tokens (stride %d) in %.1f s", len(docs),
                len(split.texts), passages.size, passages.stride, time.perf_counter() - t0)
    key = hashlib.sha256(f"{corpus.sha256}|passages={passages.size}:{passages.stride}".encode()).hexdigest()
    return IndexTexts(split.texts, key, split)


def truncation_report(encoder: BiEncoder, texts: list[str], what: str, known: dict | None = None) -> dict:
    """How much the encoder cuts off ``texts`` (``known``: as recorded when they were encoded; else they are
    tokenised); a warning when it is a large share."""
    t = known or encoder.tokens.truncation(texts)
    if t["share_tokens_dropped"] > TRUNCATION_WARN_SHARE:
        logger.warning("%d of %d %s (%.0f%%) are longer than the encoder's %d tokens: %.0f%% of the corpus's tokens "
                       "are never seen by the dense side; index with --passages N[:STRIDE] to keep them", t["truncated"],
                       t["texts"], what, 100 * t["share_truncated"], t["max_length"], 100 * t["share_tokens_dropped"])
    return t


def _save_quietly(cache: EmbeddingCache, key: str, embeddings, info: dict) -> None:
    """The vectors cached for the next index of the same corpus; where the cache cannot be written (``RETR_CACHE``
    a file, read-only, full), a warning: the index is built all the same."""
    try:
        cache.save(key, embeddings, info)
    except OSError as e:
        logger.warning("embeddings not cached in %s (%s): the next index of this corpus encodes it again",
                       cache.root, e.strerror or e)


def corpus_embeddings(encoder: BiEncoder, corpus: Corpus, use_cache: bool = True,
                      cache: EmbeddingCache | None = None, texts: IndexTexts | None = None,
                      executor: ExecutorConfig | None = None) -> tuple[np.ndarray, dict]:
    """Embeddings of ``corpus`` (or of ``texts`` made from it: its passages) from the cache, or encoded by
    ``executor`` (and then cached: where they were encoded does not change what they are)."""
    cache = cache or EmbeddingCache()
    texts = texts or IndexTexts([d.full_text() for d in corpus.docs], corpus.sha256)
    key = embedding_key(encoder.model_hash, texts.sha256, encoder.max_length,
                        encoder.planner.graph_id(texts.texts), encoder.prompts.document)
    if use_cache:
        hit = cache.load(key, len(texts.texts), encoder.dim,
                         expect={"model_hash": encoder.model_hash, "corpus_sha256": texts.sha256,
                                 "max_length": encoder.max_length, "doc_prompt": encoder.prompts.document})
        if hit is not None:
            return hit[0], {"cached": True, "cache_key": key, "encode_seconds": 0.0, "graph": hit[1].get("graph"),
                            "truncation": hit[1].get("truncation")}
    logger.info("encoding %d %s with %s (max length %d, through %s)", len(texts.texts),
                "passages" if texts.passages else "documents", encoder.model_id, encoder.max_length,
                encoder.planner.corpus_backend)
    t0 = time.perf_counter()
    executor = executor or ExecutorConfig()
    encoded = EXECUTORS[executor.name](encoder, texts.texts, executor)
    seconds = time.perf_counter() - t0
    encoder.planner.release()  # the int8 graph and the token ids: not needed by what follows (searching)
    # recorded with the vectors: measured by the encoding's own tokenisation, else (torch) by counting tokens now
    truncation = encoded.truncation or encoder.tokens.truncation(texts.texts)
    if use_cache:
        _save_quietly(cache, key, encoded.embeddings, {
            "model": encoder.model_id, "model_hash": encoder.model_hash, "backend": encoder.backend,
            "corpus_sha256": texts.sha256, "max_length": encoder.max_length, "encode_seconds": seconds,
            "doc_prompt": encoder.prompts.document,
            "graph": encoded.graph, "truncation": truncation})
    # seconds include a first calibration of the model's int8 graph (openvino-int8), once per model
    return encoded.embeddings, {"cached": False, "cache_key": key, "encode_seconds": seconds, "graph": encoded.graph,
                                "truncation": truncation,
                                "executor": encoded.executor,
                                "docs_per_second": len(corpus) / seconds if seconds > 0 else None,
                                "texts_per_second": len(texts.texts) / seconds if seconds > 0 else None}


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
    if any(out.iterdir()) and not (is_index_folder(out, INDEX_KIND) or is_index_folder(out, SHARDED_KIND)):
        raise RetrError(f"{out}: exists and is not a retr index folder (no retr manifest): refusing to replace it; "
                        f"choose another --out, or remove it yourself")


def shard_of(doc_ids: Sequence[str], shards: int) -> np.ndarray:
    """Each id's shard: a stable hash of the id (sha256, first 8 bytes) modulo ``shards``, the same on every
    machine and in every run."""
    return np.fromiter((int.from_bytes(hashlib.sha256(d.encode("utf-8")).digest()[:8], "big") % shards
                        for d in doc_ids), dtype=np.int64, count=len(doc_ids))


@dataclass(frozen=True)
class Encoded:
    """A corpus made ready for the dense side: its texts (documents or passages) and their vectors."""
    texts: IndexTexts
    emb: np.ndarray
    info: dict
    truncation: dict


def encode_for_index(encoder: BiEncoder, corpus: Corpus, cfg: IndexConfig,
                     cache: EmbeddingCache | None = None, texts: IndexTexts | None = None) -> Encoded:
    """``corpus``'s vectors for the dense side (``texts``: its documents or passages, where already made)."""
    texts = texts or index_texts(encoder, corpus, cfg.passages)
    emb, info = corpus_embeddings(encoder, corpus, cfg.use_cache, cache, texts, cfg.executor)
    # recorded with the embeddings: a corpus whose vectors come from the cache is not tokenised again
    truncation = truncation_report(encoder, texts.texts, "passages" if texts.passages else "documents",
                                   info.pop("truncation", None))
    return Encoded(texts, emb, info, truncation)


def _write_index(tmp: Path, corpus: Corpus, rows: np.ndarray | None, enc: Encoded, cfg: IndexConfig,
                 encoder: BiEncoder, write_bm25_part, t_all: float, shard: dict | None = None,
                 stamp: dict | None = None, sparse: dict | None = None) -> dict:
    """One index folder in ``tmp`` of the corpus's documents ``rows`` (None: all of them)."""
    docs = corpus.docs if rows is None else [corpus.docs[i] for i in rows.tolist()]
    write_docstore(tmp, docs)
    emb, split = enc.emb, enc.texts.passages
    if rows is not None:
        if split is None:
            emb = enc.emb[rows]
        else:  # the passages of these documents, their document numbers renumbered within the shard
            local = np.full(len(corpus), -1, dtype=np.int64)
            local[rows] = np.arange(len(rows))
            keep = np.flatnonzero(local[split.docs] >= 0)
            emb = enc.emb[keep]
            split = Passages([], local[split.docs[keep]].astype(np.int32), split.spans[keep])
    t0 = time.perf_counter()
    index, params = build_faiss(emb, cfg.dense)
    faiss_seconds = time.perf_counter() - t0
    saved = save_dense(index, emb, cfg.dense.kind, tmp)
    del index  # written: not held (a flat index is as large as the embeddings) while BM25 is built
    passages = None
    if split is not None:
        np.save(tmp / PASSAGE_DOCS_FILE, split.docs)
        np.save(tmp / PASSAGE_SPANS_FILE, split.spans)
        per_doc = np.bincount(split.docs, minlength=len(docs))
        passages = {**asdict(cfg.passages), "count": len(split.docs), "docs_file": PASSAGE_DOCS_FILE,
                    "spans_file": PASSAGE_SPANS_FILE, "max_per_doc": int(per_doc.max()) if len(docs) else 0,
                    "mean_per_doc": float(per_doc.mean()) if len(docs) else 0.0}
    dense = {
        "kind": cfg.dense.kind, "metric": "inner_product", "normalized": True, "params": params,
        **saved, "dim": encoder.dim, "model": encoder.describe(),
        "passages": passages, "truncation": enc.truncation,
        "encode": enc.info, "faiss_build_seconds": faiss_seconds,
        "build_seconds": enc.info["encode_seconds"] + faiss_seconds,
        "docs_per_second": (len(corpus) / (enc.info["encode_seconds"] + faiss_seconds)),
    }
    bm25 = None
    if write_bm25_part is not None:
        bm25 = write_bm25_part(tmp / BM25_DIR, docs, rows)
        bm25["dir"] = BM25_DIR
        bm25["docs_per_second"] = len(docs) / bm25["build_seconds"] if bm25["build_seconds"] > 0 else None
    manifest = new_manifest(
        INDEX_KIND,
        num_docs=len(docs),
        corpus={"source": str(corpus.source), "sha256": corpus.sha256, "num_docs": len(corpus),
                "empty_docs": corpus.empty_docs, "fields": corpus.fields},
        dense=dense,
        bm25=bm25,
        sparse=sparse,
        shard=shard,
        build_seconds=time.perf_counter() - t_all,
        config=asdict(cfg),
        files=checksums(tmp),
    )
    manifest.update(stamp or {})
    write_manifest(tmp, manifest)
    return manifest


def build_index(corpus: Corpus, out: Path, cfg: IndexConfig = IndexConfig(), encoder: BiEncoder | None = None,
                cache: EmbeddingCache | None = None, texts: IndexTexts | None = None) -> dict:
    """Write the index for ``corpus`` to ``out`` (``cfg.shards`` > 1: a folder of shard indexes; ``texts``: its
    documents or passages as ``index_texts`` makes them, where already made). A failure leaves no ``out`` (or the
    old one)."""
    out = Path(out)
    recover_swap(out)
    check_out(out, corpus)
    encoder = encoder or BiEncoder(cfg.encoder)

    def write(tmp: Path, stamp: dict) -> dict:
        t_all = time.perf_counter()
        enc = encode_for_index(encoder, corpus, cfg, cache, texts)
        if cfg.shards > 1:
            return _write_sharded(tmp, corpus, enc, cfg, encoder, t_all, stamp)
        part = None
        if cfg.bm25 is not None:
            def part(folder, docs, _rows):
                return build_bm25([d.full_text() for d in docs], folder, cfg.bm25)
        sparse = None
        if cfg.sparse is not None:
            sparse_encoder = SparseEncoderModel(cfg.sparse)
            logger.info("encoding %d documents with the sparse encoder %s (%s)", len(corpus), sparse_encoder.ref.id,
                        sparse_encoder.kind)
            matrix, seconds = encode_sparse(sparse_encoder, [d.full_text() for d in corpus.docs])
            sparse = {"dir": SPARSE_DIR, **write_sparse(tmp / SPARSE_DIR, matrix, sparse_encoder, seconds)}
        return _write_index(tmp, corpus, None, enc, cfg, encoder, part, t_all, stamp=stamp, sparse=sparse)

    with writer_lock(out, op="index"):
        if is_index_folder(out, INDEX_KIND) or is_index_folder(out, SHARDED_KIND):
            with new_generation(out) as (tmp, number, name):  # readers keep the generation they opened
                manifest = write(tmp, {"format_version": INDEX_FORMAT_VERSION, "dir": name, "generation": number})
            collect(out)
        else:
            if out.is_dir():
                out.rmdir()  # empty (check_out): the new folder takes its place in one rename
            with atomic_dir(out) as tmp:
                manifest = write(tmp, {})
    logger.info("index written to %s (%d docs, %s%s%s)", out, len(corpus), cfg.dense.kind,
                " + bm25" if cfg.bm25 else "", f", {cfg.shards} shards" if cfg.shards > 1 else "")
    return manifest


def _write_sharded(tmp: Path, corpus: Corpus, enc: Encoded, cfg: IndexConfig, encoder: BiEncoder,
                   t_all: float, stamp: dict | None = None) -> dict:
    """``cfg.shards`` index folders (``shard-000`` ...), documents partitioned by ``shard_of`` their id, and a
    manifest listing them. BM25 is indexed once over the whole corpus and cut into shards, so that every shard
    scores with the collection's statistics (idf, average length) and a merged ranking equals the unsharded one."""
    n = cfg.shards
    owner = shard_of(corpus.ids, n)
    part = None
    if cfg.bm25 is not None:
        t0 = time.perf_counter()
        tokens = RowTokens.of([d.full_text() for d in corpus.docs], cfg.bm25)
        whole = index_bm25(tokens, cfg.bm25)
        shared = time.perf_counter() - t0

        def part(folder, _docs, rows):
            mine = np.zeros(len(corpus), dtype=bool)
            mine[rows] = True
            stats = write_bm25(tokens.select(mine), folder, cfg.bm25, model=bm25_rows(whole, rows))
            stats["build_seconds"] += shared / n
            return stats
    shards, parts = [], []
    for i in range(n):
        rows = np.flatnonzero(owner == i)
        if not len(rows):
            raise RetrError(f"--shards {n}: shard {i} would hold no document ({len(corpus)} documents): use fewer "
                            f"shards")
        name = SHARD_DIR.format(i)
        (tmp / name).mkdir()
        m = _write_index(tmp / name, corpus, rows, enc, cfg, encoder, part, t_all,
                         shard={"index": i, "of": n, "partition": SHARD_PARTITION})
        parts.append(m)
        shards.append({"dir": name, "num_docs": m["num_docs"], "manifest_sha256": _sha256(tmp / name / MANIFEST)})
    first = parts[0]["dense"]
    faiss_seconds = sum(m["dense"]["faiss_build_seconds"] for m in parts)
    dense = {**{k: first[k] for k in ("kind", "dim", "model", "truncation", "encode", "params")},
             "passages": {**first["passages"], "count": len(enc.texts.texts)} if first["passages"] else None,
             "faiss_build_seconds": faiss_seconds, "build_seconds": enc.info["encode_seconds"] + faiss_seconds,
             "bytes": sum(m["dense"]["bytes"] for m in parts)}
    bm25 = None
    if cfg.bm25 is not None:
        bm25 = {"params": asdict(cfg.bm25), "statistics": "whole collection",
                "build_seconds": sum(m["bm25"]["build_seconds"] for m in parts),
                "bytes": sum(m["bm25"]["bytes"] for m in parts)}
    manifest = new_manifest(
        SHARDED_KIND, num_docs=len(corpus), shards=shards, partition=SHARD_PARTITION, corpus=parts[0]["corpus"],
        dense=dense, bm25=bm25, build_seconds=time.perf_counter() - t_all, config=asdict(cfg),
        files={s["dir"] + "/" + MANIFEST: {"sha256": s["manifest_sha256"]} for s in shards})
    manifest["dense"]["docs_per_second"] = len(corpus) / manifest["build_seconds"]
    manifest.update(stamp or {})
    write_manifest(tmp, manifest)
    return manifest


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cached_index(name: str, corpus: Corpus, encoder: BiEncoder, cfg: IndexConfig):
    """The index (dense + BM25; an ``IndexFolder``, or a ``ShardedIndex`` with ``cfg.shards`` > 1) of ``corpus``
    from retr's cache, or built into it."""
    bm25 = cfg.bm25 or BM25Config()
    prompts = [encoder.prompts.to_dict()] if encoder.prompts.query or encoder.prompts.document else []
    passages = [asdict(cfg.passages)] if cfg.passages else []
    shards = [{"shards": cfg.shards}] if cfg.shards > 1 else []
    sparse = [{"sparse": SparseEncoderModel(cfg.sparse).ref.hash, "max_length": cfg.sparse.max_length}] \
        if cfg.sparse else []
    # the graph is named for the number of texts it encodes: passages, where their number decides it
    texts = index_texts(encoder, corpus, cfg.passages) if cfg.passages and encoder.planner.size_matters else None
    graph_id = encoder.planner.graph_id(texts.texts if texts is not None else [d.full_text() for d in corpus.docs])
    raw = json.dumps([corpus.sha256, encoder.model_hash, encoder.max_length, graph_id,
                      asdict(cfg.dense),
                      asdict(bm25), *prompts, *passages, *shards, *sparse], sort_keys=True)
    folder = cache_home() / "indexes" / f"{name}-{hashlib.sha256(raw.encode()).hexdigest()[:24]}"
    if cfg.use_cache and folder.is_dir():
        try:
            index = open_index(folder)
            if index.manifest.corpus.sha256 == corpus.sha256 and index.has_bm25:
                logger.info("index cache used: %s", folder)
                return index
        except RetrError as e:
            logger.warning("cached index %s unusable (%s): rebuilding", folder, e)
            shutil.rmtree(folder, ignore_errors=True)  # retr's own cache entry: a damaged manifest is no reason to keep it
    build_index(corpus, folder, replace(cfg, bm25=bm25), encoder=encoder, texts=texts)
    return open_index(folder)
