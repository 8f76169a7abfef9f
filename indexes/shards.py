"""Open a folder of shard indexes as one index: the shards' ids end to end (shard 0's first), one doc store and
passage map over them, and each shard's own parts for a search to fan out over (``retrieval.shards``).

A sharded folder holds ``shard-000/`` ... (each a complete retr index of the documents whose id hashes to it,
with the collection's BM25 statistics) and a manifest listing them with each one's manifest checksum.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cached_property
from pathlib import Path

import numpy as np

from retr.indexes.folder import INDEX_KIND, IndexFolder, ManifestView, open_manifest
from retr.indexes.generations import Opened, open_generation
from retr.indexes.manifest import SHARDED_SCHEMA, IndexManifest, check_shard_entries
from retr.retrieval.artifacts import MANIFEST, open_regular
from retr.retrieval.errors import RetrError
from retr.retrieval.passages import PassageMap
from retr.retrieval.types import Document

SHARDED_KIND = "retr-sharded-index"
SHARD_DIR = "shard-{:03d}"
SHARD_PARTITION = "sha256(id)[:8] mod shards"


def _format(opened: Opened) -> object:
    try:
        manifest = json.loads(opened.data or b"")
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return manifest.get("format") if isinstance(manifest, dict) else None


def open_index(folder: str | Path):
    """The index at ``folder`` (its current generation, leased while it is open): an ``IndexFolder``, or a
    ``ShardedIndex`` for a folder of shards."""
    opened = open_generation(Path(folder))
    try:
        if _format(opened) == SHARDED_KIND:
            return ShardedIndex(folder, opened)
        return IndexFolder(folder, opened)
    except BaseException:
        opened.release()
        raise


class ShardedDocStore:
    """The shards' doc stores as one, by position in the sharded index's id order."""

    def __init__(self, shards: list[IndexFolder], offsets: np.ndarray):
        self.shards = shards
        self.offsets = offsets  # (n_shards + 1,): shard i holds positions offsets[i]:offsets[i + 1]

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def get(self, position: int) -> Document:
        i = int(np.searchsorted(self.offsets, position, side="right")) - 1
        return self.shards[i].docstore.get(position - int(self.offsets[i]))

    def positions_where(self, conditions: dict[str, str]) -> tuple[np.ndarray, set[str]]:
        found, have = [], set()
        for shard, offset in zip(self.shards, self.offsets.tolist(), strict=False):
            positions, fields = shard.docstore.positions_where(conditions)
            found.append(positions + offset)
            have |= fields
        return np.concatenate(found).astype(np.int64), have

    def close(self) -> None:
        for shard in self.shards:
            shard.close()


class ShardedIndex(ManifestView):
    def __init__(self, folder: str | Path, opened: Opened | None = None):
        self.folder = Path(folder)
        self._opened = opened or open_generation(self.folder)
        self.shards: list[IndexFolder] = []
        try:
            raw = open_manifest(self._opened, SHARDED_KIND, SHARDED_SCHEMA)
            names = check_shard_entries(raw, self._opened.parts, self.folder / MANIFEST)
            self.manifest = IndexManifest.parse(raw, self.folder / MANIFEST)
            self._open_shards(self._opened.parts, names)
        except BaseException:
            self.close()
            raise

    def _open_shards(self, parts: Path, names: list[str]) -> None:
        for name in names:
            path = parts / name
            want = self.manifest.files[f"{name}/{MANIFEST}"].sha256
            try:
                if path.is_symlink() or not path.is_dir():
                    raise FileNotFoundError(path)
                with os.fdopen(open_regular(path / MANIFEST), "rb") as fh:
                    got = hashlib.sha256(fh.read(1 << 26)).hexdigest()
            except OSError:
                raise RetrError(f"{path}: shard missing: rebuild the index with `retr index --shards`") from None
            if got != want:
                raise RetrError(f"{path / MANIFEST}: not the shard this index was built with: rebuild it")
            shard = IndexFolder(path, flat=True)
            self.shards.append(shard)
            if shard.manifest.shard_index != len(self.shards) - 1 or shard.manifest.format != INDEX_KIND or \
                    shard.manifest.dense.model.hash != self.manifest.dense.model.hash:
                raise RetrError(f"{path}: shard {len(self.shards) - 1} of another index: rebuild it")
        counts = [len(s.ids) for s in self.shards]
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.ids = [d for s in self.shards for d in s.ids]
        if len(self.ids) != self.manifest.num_docs:
            raise RetrError(f"{self.folder}: shards hold {len(self.ids)} documents, manifest says "
                            f"{self.manifest.num_docs}")

    @cached_property
    def docstore(self) -> ShardedDocStore:
        return ShardedDocStore(self.shards, self.offsets)

    @cached_property
    def passages(self) -> PassageMap | None:
        """One passage map over the shards' (document numbers in this index's position order)."""
        parts = [s.passages for s in self.shards]
        if parts[0] is None:
            return None
        docs = np.concatenate([np.asarray(p.docs, dtype=np.int64) + o for p, o in zip(parts, self.offsets.tolist(),
                                                                                        strict=False)])
        spans = np.concatenate([np.asarray(p.spans) for p in parts])
        return PassageMap(docs, spans, parts[0].aggregate, len(self.ids))

    def close(self) -> None:
        for shard in self.shards:
            shard.close()
        self._release()
