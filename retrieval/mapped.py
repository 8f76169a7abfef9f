"""Files read through memory maps, checked against the size they had when mapped before each read.

A page of a map past its file's end is SIGBUS: a part of a live generation cut short under its reader (a backup
restored with ``cp`` over it: ``cp`` truncates, then writes) would kill the process, with no error and nothing
logged. Each mapped part is a ``MappedFile``; ``check()`` (an ``fstat``: ~6 µs on a loaded 2-core EPYC) comes before each
read, and a file shorter than when mapped is a one-line ``DamagedPart`` (a ``RetrError``) naming it.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import numpy as np

from retr.retrieval.errors import RetrError


class DamagedPart(RetrError):
    """A part of an open index changed on disk under its reader: the request fails, the reader lives on."""


class MappedFile:
    """One mapped file: an fd on the inode that was mapped, and the size it had then."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise RetrError(f"{self.path}: cannot be read ({e.strerror})") from None
        self.size = os.fstat(self.fd).st_size
        self._close = weakref.finalize(self, os.close, self.fd)

    def check(self) -> None:
        """A ``DamagedPart`` where the file is now shorter than it was when mapped."""
        try:
            now = os.fstat(self.fd).st_size
        except OSError:  # closed: the reader was closed
            raise RetrError(f"{self.path}: read after its index was closed") from None
        if now < self.size:
            raise DamagedPart(f"{self.path}: {now} bytes, {self.size} when this reader opened it: the file was cut "
                              f"short under a live reader; restore the index's parts, or rebuild it with `retr index`")

    def close(self) -> None:
        self._close()


def check_all(files: list[MappedFile]) -> None:
    for f in files:
        f.check()


def load_mapped(path: str | Path, files: list[MappedFile]) -> np.ndarray:
    """``np.load(path, mmap_mode="r")``, its file appended to ``files`` (checked before each read)."""
    mapped = MappedFile(path)
    try:
        array = np.load(f"/proc/self/fd/{mapped.fd}" if os.path.isdir("/proc/self/fd") else mapped.path,
                        mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        mapped.close()
        raise RetrError(f"{mapped.path}: unreadable ({e})") from None
    files.append(mapped)
    return array


def attach(index, files: list[MappedFile]):
    """``index`` (a FAISS index, which takes no new attribute) holding ``files``, its mapped parts: ``attached``
    finds them (FAISS keeps Python objects alive in ``referenced_objects``)."""
    index.referenced_objects = [*(getattr(index, "referenced_objects", None) or []), *files]
    return index


def attached(index) -> list[MappedFile]:
    return [f for f in getattr(index, "referenced_objects", None) or () if isinstance(f, MappedFile)]
