"""Embedding cache keyed by (model hash, corpus checksum, max length, backend): never encode twice.

Lives under ``$RETR_CACHE/embeddings/<key>/``: a plain ``embeddings.npy`` memory-mapped on load and a
``meta.json`` written last with the array's sha256. An entry whose checksum, shape, values (NaN/inf) or norms
are wrong is discarded with a warning, and the corpus is encoded again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from retr.indexes.dense import row_blocks
from retr.retrieval.artifacts import atomic_dir, cache_home, file_sha256, read_small, write_json
from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

NORM_TOLERANCE = 1e-2  # stored vectors are L2-normalised (bf16/int8 graphs included: measured within 1e-3)


def embedding_key(model_hash: str, corpus_sha256: str, max_length: int, backend: str, doc_prompt: str = "") -> str:
    raw = f"{model_hash}|{corpus_sha256}|{max_length}|{backend}|normalized" + (f"|prompt={doc_prompt}" if doc_prompt else "")
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def check_vectors(emb: np.ndarray, block: int = 65536) -> str | None:
    """Why ``emb`` is not a matrix of finite unit vectors, or None (read in blocks: bounded memory)."""
    for start, part in zip(range(0, len(emb), block), row_blocks(emb, block), strict=True):
        if not np.isfinite(part).all():
            return f"row {start + int(np.argwhere(~np.isfinite(part))[0][0])} holds NaN or inf"
        norms = np.linalg.norm(part, axis=1)
        bad = np.flatnonzero(np.abs(norms - 1.0) > NORM_TOLERANCE)
        if len(bad):
            return f"row {start + int(bad[0])} has norm {norms[bad[0]]:.4f}, not 1"
    return None


class EmbeddingCache:
    def __init__(self, root: Path | None = None):
        self.root = (root or cache_home()) / "embeddings"

    def path(self, key: str) -> Path:
        return self.root / key

    def _discard(self, folder: Path, why: str) -> None:
        logger.warning("embedding cache %s is damaged (%s): discarded, the corpus is encoded again", folder, why)
        shutil.rmtree(folder, ignore_errors=True)

    def load(self, key: str, num_docs: int, dim: int, expect: Mapping | None = None) -> tuple[np.ndarray, dict] | None:
        """(embeddings memory-mapped, the info saved with them), or None (absent, or damaged and discarded). An
        entry is another's where its info names another ``key``, or (an entry of an earlier retr, which recorded no
        key) differs from ``expect`` in a field both hold: another entry's files in its place."""
        folder = self.path(key)
        if not folder.is_dir():
            return None
        npy = folder / "embeddings.npy"
        try:
            meta = json.loads(read_small(folder / "meta.json"))
            if not isinstance(meta, dict):
                raise ValueError("meta.json is not a JSON object")
            named = {k: meta[k] for k in (expect or {}) if k in meta}
            if meta.get("key", key) != key or any(named[k] != expect[k] for k in named):
                raise ValueError("its info names another corpus, model or graph")
            if meta.get("shape") != [num_docs, dim]:
                raise ValueError(f"shape {meta.get('shape')}, expected {[num_docs, dim]}")
            if file_sha256(npy) != meta.get("sha256"):
                raise ValueError("embeddings.npy differs from its checksum")
            emb = np.load(npy, mmap_mode="r")
            if emb.shape != (num_docs, dim) or emb.dtype != np.float32:
                raise ValueError(f"array of shape {emb.shape} ({emb.dtype})")
        except (OSError, ValueError, RetrError) as e:  # RetrError: a part that is not a regular file
            self._discard(folder, str(e))
            return None
        bad = check_vectors(emb)
        if bad:
            self._discard(folder, bad)
            return None
        logger.info("embedding cache used: %s (%d x %d), nothing re-encoded", folder, num_docs, dim)
        return emb, meta

    def save(self, key: str, emb: np.ndarray, info: dict) -> None:
        with atomic_dir(self.path(key)) as tmp:
            np.save(tmp / "embeddings.npy", np.asarray(emb, dtype=np.float32))
            write_json(tmp / "meta.json", {**info, "key": key, "shape": list(emb.shape),
                                           "sha256": file_sha256(tmp / "embeddings.npy")})
