"""Change an index without rebuilding it: add (or update) documents, delete them, compact.

Each change writes a new generation of the folder and publishes it atomically (``retr.indexes.generations``),
under the folder's writer lock: a reader keeps the generation it opened, every part of it, for as long as it
holds it open; ``retr serve`` swaps to the new one by itself. The live
documents are the *rows*; a search after any change returns what a fresh build of the live documents, in row
order, returns:

- add: only the new documents are encoded, with the index's model and the graph its vectors came from; the doc
  store is copied with the new records appended (a document whose id is already live is an update: its old
  position becomes a tombstone). Delete: positions become tombstones; the doc store and id list are linked into
  the new generation, not copied.
- BM25 statistics (document frequencies, average length) are recomputed over the live rows from their stored
  token ids, never re-tokenised; the dense part is rebuilt from the live vectors (flat: a copy; HNSW and IVF-PQ:
  the structure is built again over them, as a fresh build would, with the index's configuration).
- compact: the doc store and id list are rewritten without the tombstoned records; nothing else changes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from retr.indexes.bm25 import RowTokens, write_bm25
from retr.indexes.corpus import Corpus, CorpusFormat
from retr.indexes.dense import DenseIndexConfig, build_faiss, dense_files, live_vectors, save_dense
from retr.indexes.docstore import DOCS, IDS, OFFSETS, TOMBSTONES, write_docstore
from retr.indexes.folder import IndexFolder
from retr.indexes.generations import collect, new_generation
from retr.indexes.manifest import INDEX_FORMAT_VERSION, is_index_folder, load_manifest, write_manifest
from retr.indexes.shards import SHARDED_KIND
from retr.indexes.sparse import SPARSE_DIR, encode_sparse, write_sparse
from retr.retrieval.artifacts import checksums, read_text, versions, writer_lock
from retr.retrieval.bm25 import BM25_DIR, BM25Config
from retr.retrieval.compose import encoder_for_index
from retr.retrieval.encoder import EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.sparse import sparse_encoder_for
from retr.retrieval.types import Document

logger = logging.getLogger(__name__)

_STORE_FILES = (DOCS, OFFSETS, IDS)


@dataclass(frozen=True)
class Change:
    """What one change did."""
    generation: int
    added: int
    updated: int
    deleted: int
    live: int
    tombstones: int
    encode_seconds: float
    seconds: float


def _config(cls, recorded: Mapping | None):
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in (recorded or {}).items() if k in names})


def _link(src: Path, dst: Path, names: Iterable[str], recorded: dict) -> dict:
    """Hard-link unchanged parts into the new generation (never written in place, so sharing is safe); their
    checksums carry over."""
    out = {}
    for name in names:
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        os.link(src / name, dst / name)
        out[name] = recorded[name]
    return out


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()


def _live_tokens(index: IndexFolder, cfg: BM25Config) -> RowTokens:
    tokens = RowTokens.load(index.bm25_folder)
    if tokens is None:  # an index built before token ids were kept: tokenise its live documents once
        store = index.docstore
        tokens = RowTokens.of([store.get(r).full_text() for r in range(len(store))], cfg)
    if len(tokens) != len(index.ids):
        raise RetrError(f"{index.bm25_folder}: holds tokens of {len(tokens)} rows, the index {len(index.ids)}: "
                        f"rebuild it")
    return tokens


def _write_generation(index: IndexFolder, keep: np.ndarray, docs: list[Document], vectors: np.ndarray | None,
                      op: dict, encode_seconds: float = 0.0) -> Change:
    """The next generation of ``index``: its rows ``keep`` (a mask over rows), then ``docs`` (with ``vectors``)."""
    t0 = time.perf_counter()
    m = index.manifest
    folder = index.folder
    parts = index.parts
    stored = len(index.stored_ids)
    rows = index.rows if index.rows is not None else np.arange(stored)
    dead = np.union1d(index.tombstones, rows[~keep]).astype(np.int64)
    live = int(keep.sum()) + len(docs)
    if live == 0:
        raise RetrError(f"{folder}: the change would leave the index empty: build a new one instead")
    new = m.to_dict()
    with new_generation(folder) as (tmp, generation, name):
        if docs:
            write_docstore(tmp, docs, after=parts)
            files = checksums(tmp, _STORE_FILES)
        else:
            files = _link(parts, tmp, _STORE_FILES, new["files"])
        if len(dead):
            np.save(tmp / TOMBSTONES, dead)
            files.update(checksums(tmp, [TOMBSTONES]))

        emb = np.asarray(live_vectors(parts, m.dense.raw, index.faiss_index))[keep]
        if vectors is not None and len(vectors):
            emb = np.concatenate([emb, vectors.astype(np.float32)])
        dense_cfg = _config(DenseIndexConfig, m.config.get("dense"))
        t_faiss = time.perf_counter()
        faiss_index, params = build_faiss(emb, dense_cfg)
        faiss_seconds = time.perf_counter() - t_faiss
        saved = save_dense(faiss_index, emb, dense_cfg.kind, tmp)
        del faiss_index  # written: not held while BM25 is rebuilt
        new["dense"].update(params=params, faiss_build_seconds=faiss_seconds, **saved)
        files.update(checksums(tmp, dense_files(saved)))

        if index.has_bm25:
            cfg = _config(BM25Config, m.bm25.params)
            tokens = _live_tokens(index, cfg).select(keep)
            if docs:
                tokens = tokens.extend(RowTokens.of([d.full_text() for d in docs], cfg))
            stats = write_bm25(tokens, tmp / BM25_DIR, cfg)
            new["bm25"].update(build_seconds=stats["build_seconds"], bytes=stats["bytes"],
                               vocab_size=stats["vocab_size"])
            files.update({f"{BM25_DIR}/{k}": v for k, v in checksums(tmp / BM25_DIR).items()})

        if index.has_sparse:
            encode_seconds += _write_sparse_generation(index, keep, docs, tmp, new)
            files.update({f"{SPARSE_DIR}/{k}": v for k, v in checksums(tmp / SPARSE_DIR).items()})

        seconds = time.perf_counter() - t0 + encode_seconds
        op = {**op, "generation": generation, "seconds": seconds, "encode_seconds": encode_seconds,
              "faiss_build_seconds": faiss_seconds, "live": live, "tombstones": len(dead)}
        new.update(num_docs=live, stored_docs=stored + len(docs), tombstones=len(dead), generation=generation,
                   changes=[*m.changes, op], files=files, versions=versions(),
                   format_version=INDEX_FORMAT_VERSION, dir=name)
        new["corpus"] = {**new["corpus"], "num_docs": live,
                         "sha256": _digest(m.corpus.sha256, op["op"], op.get("sha256", ""))}
        write_manifest(tmp, new)
    logger.info("%s: generation %d written (%d live, %d tombstones)", folder, generation, live, len(dead))
    return Change(generation, op.get("added", 0), op.get("updated", 0), op.get("deleted", 0), live, len(dead),
                  encode_seconds, seconds)


def _write_sparse_generation(index: IndexFolder, keep: np.ndarray, docs: list[Document], tmp: Path,
                             new: dict) -> float:
    """The sparse part of the next generation: the live rows ``keep``, then ``docs`` encoded by the model the
    part was built with (its hash checked); returns the seconds spent encoding."""
    import scipy.sparse as sp

    matrix = index.sparse_matrix[np.flatnonzero(keep)]
    encoder = sparse_encoder_for(index.folder, index.manifest.sparse.model)
    seconds = 0.0
    if docs:
        added, seconds = encode_sparse(encoder, [d.full_text() for d in docs])
        matrix = sp.vstack([matrix, added.astype(np.float32)], format="csr")
    entry = write_sparse(tmp / SPARSE_DIR, matrix, encoder, seconds)
    new["sparse"] = {**new["sparse"], **{k: entry[k] for k in ("nnz", "mean_nnz_per_doc", "bytes")}}
    return seconds


def _open_changeable(folder: Path) -> IndexFolder:
    if is_index_folder(folder, SHARDED_KIND):
        raise RetrError(f"{folder}: a sharded index cannot change yet (add, delete and compact work on one index "
                        f"folder): rebuild it with `retr index --shards`")
    return IndexFolder(folder)


def _check_changeable(index: IndexFolder) -> None:
    if index.manifest.shard_index is not None:
        raise RetrError(f"{index.folder}: a shard of a sharded index cannot change on its own (its BM25 holds the "
                        f"whole collection's statistics): rebuild the index with `retr index --shards`")
    if index.manifest.dense.passages is not None:
        raise RetrError(f"{index.folder}: an index of passages cannot change yet (add, delete and compact keep one "
                        f"vector per document): rebuild it with `retr index --passages`")


def recorded_format(folder: str | Path, fmt: CorpusFormat | None = None) -> CorpusFormat:
    """``fmt`` with each field it leaves to detection (None) taken from the fields the index at ``folder`` was
    built with (its manifest's ``corpus.fields``; a title recorded as none stays none): documents added to an
    index are read as its own were. Fields the manifest does not record stay as given."""
    fmt = fmt or CorpusFormat()
    if is_index_folder(Path(folder), SHARDED_KIND):
        return fmt  # the change itself refuses a sharded index
    try:
        fields = load_manifest(Path(folder)).corpus.fields
    except RetrError:
        return fmt  # the change itself says what is wrong with the folder
    if not fields.recorded:
        return fmt
    return CorpusFormat(fmt.id_field if fmt.id_field is not None else fields.id,
                        fmt.text_field if fmt.text_field is not None else fields.text,
                        fmt.title_field if fmt.title_field is not None else (fields.title or ""))


def add_documents(folder: str | Path, corpus: Corpus, encoder: EncoderConfig | None = None) -> Change:
    """Add ``corpus``'s documents to the index at ``folder``; one whose id is live already replaces it. Read
    ``corpus`` with ``recorded_format(folder, ...)``: with the fields the index was built with."""
    folder = Path(folder)
    if not len(corpus):
        raise RetrError(f"{corpus.source}: no documents to add")
    with writer_lock(folder, op="add"):
        index = _open_changeable(folder)
        try:
            _check_changeable(index)
            built = index.manifest.dense.model
            enc = encoder_for_index(index, encoder or EncoderConfig(backend=built.backend or "torch"))
            t0 = time.perf_counter()
            recorded = index.manifest.dense.encode.get("graph") or {}
            vectors = enc.encode_like([d.full_text() for d in corpus.docs], recorded, show_progress=len(corpus) > 100)
            encode_seconds = time.perf_counter() - t0
            updated = {d.doc_id for d in corpus.docs} & set(index.ids)
            keep = np.fromiter((i not in updated for i in index.ids), dtype=bool, count=len(index.ids))
            op = {"op": "add", "source": str(corpus.source), "sha256": corpus.sha256, "added": len(corpus) - len(updated),
                  "updated": len(updated), "deleted": 0}
            change = _write_generation(index, keep, corpus.docs, vectors, op, encode_seconds)
        finally:
            index.close()
        collect(folder)  # the generation this writer read is no longer held by it
        return change


def read_id_list(path: str | Path) -> dict[str, int]:
    """Ids, one per line (blank lines skipped), each with the line it was first read from."""
    out: dict[str, int] = {}
    for lineno, line in enumerate(read_text(Path(path)).splitlines(), start=1):
        if line.strip():
            out.setdefault(line.strip(), lineno)
    return out


def delete_documents(folder: str | Path, ids: Sequence[str] | Mapping[str, int], source: str = "ids",
                     missing_ok: bool = False) -> Change:
    """Delete the documents ``ids`` from the index at ``folder`` (tombstones); an id it does not hold is an error
    naming it and where it came from (``source``, and the line where ``ids`` maps each id to one), unless
    ``missing_ok``."""
    folder = Path(folder)
    wanted = list(dict.fromkeys(ids))
    lines = ids if isinstance(ids, Mapping) else {i: n for n, i in reversed(list(enumerate(ids, start=1)))}
    if not wanted:
        raise RetrError(f"{source}: no ids to delete")
    with writer_lock(folder, op="delete"):
        index = _open_changeable(folder)
        try:
            _check_changeable(index)
            live = set(index.ids)
            missing = [i for i in wanted if i not in live]
            if missing and not missing_ok:
                raise RetrError(f"{source}:{lines[missing[0]]}: no live document {missing[0]!r} in {folder} "
                                f"({len(missing)} of {len(wanted)} ids missing; --missing-ok skips them)")
            gone = set(wanted) & live
            if not gone:  # (only with missing_ok) deleted already: a script run again changes nothing
                logger.info("%s: none of its %d ids is in %s: nothing to delete", source, len(wanted), folder)
                return Change(index.manifest.generation, 0, 0, 0, len(live), index.manifest.tombstones, 0.0, 0.0)
            keep = np.fromiter((i not in gone for i in index.ids), dtype=bool, count=len(index.ids))
            op = {"op": "delete", "source": source, "sha256": _digest(*sorted(gone)), "added": 0, "updated": 0,
                  "deleted": len(gone), "missing": len(missing)}
            change = _write_generation(index, keep, [], None, op)
        finally:
            index.close()
        collect(folder)
        return change


def compact_index(folder: str | Path) -> Change:
    """Fold the tombstones of the index at ``folder`` away: its doc store and id list keep live records only."""
    folder = Path(folder)
    t0 = time.perf_counter()
    with writer_lock(folder, op="compact"):
        index = _open_changeable(folder)
        try:
            _check_changeable(index)
            m = index.manifest
            generation = m.generation
            if index.rows is None:
                logger.info("%s: no tombstones: nothing to compact", folder)
                return Change(generation, 0, 0, 0, len(index.ids), 0, 0.0, 0.0)
            store = index.docstore
            new = m.to_dict()
            with new_generation(folder) as (tmp, generation, name):
                write_docstore(tmp, (store.get(r) for r in range(len(store))))
                files = checksums(tmp, _STORE_FILES)
                kept = [f for f in new["files"] if f not in (*_STORE_FILES, TOMBSTONES)]
                files.update(_link(index.parts, tmp, kept, new["files"]))
                op = {"op": "compact", "generation": generation, "removed": m.tombstones,
                      "seconds": time.perf_counter() - t0, "live": len(index.ids), "tombstones": 0}
                new.update(stored_docs=len(index.ids), tombstones=0, generation=generation,
                           changes=[*m.changes, op], files=files, versions=versions(),
                           format_version=INDEX_FORMAT_VERSION, dir=name)
                write_manifest(tmp, new)
        finally:
            index.close()
        collect(folder)
    logger.info("%s: compacted (%d tombstones removed)", folder, op["removed"])
    return Change(generation, 0, 0, 0, op["live"], 0, 0.0, time.perf_counter() - t0)
