"""A doc store for titles and text: JSONL plus a memory-mapped offsets array (no pickle).

Records are stored by position (the id list names each). An index that has changed may hold tombstones:
positions deleted (or replaced by a later record of the same id) that ``retr compact`` folds away. Readers
address documents by *row*, the n-th live position; without tombstones rows are positions.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from retr.retrieval.errors import RetrError
from retr.retrieval.mapped import MappedFile, check_all, load_mapped
from retr.retrieval.types import Document

DOCS = "docstore.jsonl"
OFFSETS = "docstore.offsets.npy"
IDS = "ids.json"
TOMBSTONES = "tombstones.npy"


def _record(d: Document) -> bytes:
    rec = {"_id": d.doc_id, "title": d.title, "text": d.text}
    if d.metadata:
        rec["metadata"] = dict(d.metadata)
    return (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")


def write_docstore(folder: Path, docs: Iterable[Document], after: Path | None = None) -> int:
    """Write the doc store of ``docs`` into ``folder``; with ``after`` (another index folder), the records of that
    folder's doc store come first, copied as they are (positions kept), and ``docs`` are appended."""
    offsets, ids = [0], []
    with (folder / DOCS).open("wb") as fh:
        if after is not None:
            with (after / DOCS).open("rb") as src:
                shutil.copyfileobj(src, fh, 1 << 20)
            offsets = np.load(after / OFFSETS).tolist()
            ids = read_ids(after)
            if fh.tell() != offsets[-1]:  # a part cut short (or replaced) since the index was opened
                raise RetrError(f"{after / DOCS}: {fh.tell()} bytes, its offsets say {offsets[-1]}: the index is "
                                f"damaged; it is unchanged")
        for d in docs:
            data = _record(d)
            fh.write(data)
            offsets.append(offsets[-1] + len(data))
            ids.append(d.doc_id)
    np.save(folder / OFFSETS, np.asarray(offsets, dtype=np.int64))
    (folder / IDS).write_text(json.dumps(ids, ensure_ascii=False), encoding="utf-8")
    return len(ids)


def read_tombstones(folder: Path, n_positions: int) -> np.ndarray:
    """The deleted positions (sorted, unique, in range) of an index folder; empty when it has none."""
    path = folder / TOMBSTONES
    if not path.is_file():
        return np.zeros(0, dtype=np.int64)
    try:
        dead = np.load(path)
    except (OSError, ValueError) as e:
        raise RetrError(f"{path}: unreadable ({e})") from None
    if dead.ndim != 1 or dead.dtype.kind not in "iu" or (len(dead) and (dead.min() < 0 or dead.max() >= n_positions
                                                                        or np.any(np.diff(dead) <= 0))):
        raise RetrError(f"{path}: not a sorted list of positions below {n_positions}: the index is damaged")
    return dead.astype(np.int64)


def read_ids(folder: Path) -> list[str]:
    path = folder / IDS
    try:
        ids = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RetrError(f"{path}: unreadable id list ({e})") from None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise RetrError(f"{path}: expected a JSON list of string ids")
    return ids


class DocStore:
    """Random access to stored documents by position, without loading the corpus. Each read checks that the
    record is the document the id list names at that position, and first that neither file was cut short
    (``retr.retrieval.mapped``: never SIGBUS). Records are read with ``pread`` (a file cut short after the check
    gives a short read, never a fault); the offsets are mapped."""

    def __init__(self, folder: Path, ids: Sequence[str], rows: np.ndarray | None = None):
        """``ids``: the id at every stored position; ``rows``: the live positions in order (None: all)."""
        self.path = folder / DOCS
        self.ids = ids
        self.rows = rows
        self._mapped: list[MappedFile] = []
        self.offsets = load_mapped(folder / OFFSETS, self._mapped)
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets.dtype.kind not in "iu":
            raise RetrError(f"{folder / OFFSETS}: not a list of offsets: rebuild the index")
        if not self.path.is_file():
            raise RetrError(f"{self.path}: missing from the index folder")
        self._docs = MappedFile(self.path)
        self._mapped.append(self._docs)
        size = self._docs.size
        if size != int(self.offsets[-1]) or int(self.offsets[0]) != 0:
            raise RetrError(f"{self.path}: {size} bytes, its offsets say {int(self.offsets[-1])}: rebuild the index")

    @property
    def stored(self) -> int:
        return len(self.offsets) - 1

    def __len__(self) -> int:
        return self.stored if self.rows is None else len(self.rows)

    def get(self, row: int) -> Document:
        """The document at ``row`` (the row-th live position)."""
        position = row if self.rows is None else int(self.rows[row])
        check_all(self._mapped)
        start, end = int(self.offsets[position]), int(self.offsets[position + 1])
        data = os.pread(self._docs.fd, end - start, start)
        if len(data) != end - start:
            self._docs.check()  # cut short between the check and the read
        try:
            rec = json.loads(data)
            doc = Document(str(rec["_id"]), str(rec.get("title", "")), str(rec.get("text", "")),
                           dict(rec.get("metadata") or {}))
        except (ValueError, KeyError, TypeError):
            raise RetrError(f"{self.path}: the record at position {position} is damaged (bytes {start}-{end}): "
                            f"rebuild the index") from None
        if doc.doc_id != self.ids[position]:
            raise RetrError(f"{self.path}: position {position} holds document {doc.doc_id!r} but the id list says "
                            f"{self.ids[position]!r}: the index is damaged; rebuild it")
        return doc

    def positions_where(self, conditions: dict[str, str]) -> tuple[np.ndarray, set[str]]:
        """Rows (sorted) of the documents whose metadata matches every ``field: value``, and the metadata
        fields seen in the store (one full read, once per filter: the caller keeps what it needs)."""
        found, fields = [], set()
        for i in range(len(self)):
            doc = self.get(i)
            fields.update(doc.metadata)
            if doc.matches(conditions):
                found.append(i)
        return np.asarray(found, dtype=np.int64), fields

    def close(self) -> None:
        for f in self._mapped:
            f.close()

    def __enter__(self) -> DocStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
