"""Embedding cache keyed by (model hash, corpus checksum, max length, backend): never encode twice.

Lives under ``$RETR_CACHE`` (default ``~/.cache/retr``)/embeddings/<key>/ as a plain ``.npy`` that
is memory-mapped on load, plus a small JSON describing it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np

from retr.indexes.atomic import atomic_dir

logger = logging.getLogger(__name__)


def cache_home() -> Path:
    return Path(os.environ.get("RETR_CACHE") or Path.home() / ".cache" / "retr").expanduser()


def embedding_key(model_hash: str, corpus_sha256: str, max_length: int, backend: str) -> str:
    raw = f"{model_hash}|{corpus_sha256}|{max_length}|{backend}|normalized"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


class EmbeddingCache:
    def __init__(self, root: Path | None = None):
        self.root = (root or cache_home()) / "embeddings"

    def path(self, key: str) -> Path:
        return self.root / key

    def load(self, key: str, num_docs: int, dim: int) -> tuple[np.ndarray, dict] | None:
        """(embeddings memory-mapped, the info saved with them), or None."""
        folder = self.path(key)
        try:
            meta = json.loads((folder / "meta.json").read_text())
            emb = np.load(folder / "embeddings.npy", mmap_mode="r")
        except (OSError, ValueError):
            return None
        if emb.shape != (num_docs, dim) or meta.get("shape") != [num_docs, dim]:
            logger.warning("embedding cache %s has shape %s, expected %s: ignored", folder, emb.shape, (num_docs, dim))
            return None
        logger.info("embedding cache used: %s (%d x %d), nothing re-encoded", folder, num_docs, dim)
        return emb, meta

    def save(self, key: str, emb: np.ndarray, info: dict) -> None:
        with atomic_dir(self.path(key)) as tmp:
            np.save(tmp / "embeddings.npy", np.asarray(emb, dtype=np.float32))
            (tmp / "meta.json").write_text(json.dumps({**info, "shape": list(emb.shape)}, indent=2))
