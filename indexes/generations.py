"""Generations of an index folder, read through one commit point (as Lucene's readers are).

An index folder holds immutable generations. A fresh build into a new folder is generation 0 at the folder's
root (the layout of format 1); every later change (``retr add``/``delete``/``compact``, a rebuild over the folder)
writes ``gen-NNNNNN/`` beside it and publishes it by replacing ``manifest.json`` (the pointer, holding the
generation's whole manifest and its ``dir``) in one atomic rename. Readers:

- read the pointer once and open every part (ids, FAISS, BM25, doc store, tombstones, passages) from the one
  generation it names, including parts loaded lazily later;
- hold a *lease* on it: a shared ``flock`` on the generation's folder, for as long as the index is open. A writer
  removes a superseded generation only when it can take that lock exclusively (no reader holds it), never one a
  live reader holds, however long it reads. A lease and not keep-the-last-N: a service may keep a generation
  open for days while many changes pass, and N would have to bound how long a reader may live;
- open during a write: always the old generation or the new one (a reader that meets a generation being
  removed retries from the pointer).

A crash at any step of publishing leaves the old generation published and the new one either absent, unfinished
(a hidden ``.gen-N.PID.building`` folder without its manifest, removed by the next writer), or complete but not yet
published (its manifest written and every part matching it, under its hidden name or its final one): the next open
renames it to its final name and reads it, the newest complete generation, and the next writer publishes it.
Nothing complete is deleted but a superseded generation no reader holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from retr.retrieval.artifacts import MANIFEST, atomic_write_bytes, fsync_tree, pid_alive, read_small
from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

GEN_DIR = "gen-{:06d}"
_GEN_RE = re.compile(r"^gen-(\d{6,9})$")
_BUILDING_RE = re.compile(r"^\.gen-(\d{6,9})\.(\d+)\.(building|removing)$")
# what a generation at the root (format 1, or a fresh build) holds beside its manifest: removed once superseded
ROOT_PART_RE = re.compile(r"^(ids\.json|docstore\.jsonl|docstore\.offsets\.npy|tombstones\.npy|dense\.faiss|"
                          r"refine\.faiss|vectors\.npy|passage_docs\.npy|passage_spans\.npy|bm25|sparse|shard-\d{3,})$")
OPEN_TRIES = 200
_WRITING: set[str] = set()  # the generation folders this process is writing now


def generation_dir(name: object) -> str:
    """``name`` if it is a generation folder's name (``gen-NNNNNN``), else a ``ValueError``."""
    if not isinstance(name, str) or not _GEN_RE.match(name):
        raise ValueError(f"{str(name)[:40]!r} is not a generation folder (gen-NNNNNN)")
    return name


def generation_number(name: str) -> int:
    return int(_GEN_RE.match(name).group(1))


class Lease:
    """A shared flock on a generation's folder: while it is held, no writer removes that generation."""

    def __init__(self, folder: Path, follow: bool = False):
        """``follow``: ``folder`` may be a symlink (the index folder itself; never a generation inside it)."""
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | (0 if follow else os.O_NOFOLLOW))
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        self.inode = os.fstat(fd).st_ino
        self._release = weakref.finalize(self, os.close, fd)

    def release(self) -> None:
        self._release()


def _exclusive(folder: Path, follow: bool = False) -> int | None:
    """An fd holding ``folder``'s flock exclusively (no reader holds it), or None."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | (0 if follow else os.O_NOFOLLOW))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _manifest_bytes(folder: Path) -> bytes:
    """``folder``'s manifest: a regular file of bounded size (``read_small``), never a FIFO or /dev/zero."""
    try:
        return read_small(folder / MANIFEST)
    except RetrError as e:
        raise RetrError(f"{e}: the index is damaged; rebuild it with `retr index`") from None


def _read_pointer(root: Path) -> tuple[bytes, dict | None]:
    """The pointer's bytes and its JSON object (None where it is not one: the manifest check then says why)."""
    data = _manifest_bytes(root)
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return data, None
    return data, obj if isinstance(obj, dict) else None


def complete_generations(root: Path) -> list[tuple[int, str]]:
    """``(number, name)`` of the generation folders under ``root`` whose manifest was written, oldest first."""
    out = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for e in entries:
        m = _GEN_RE.match(e.name)
        if m and e.is_dir(follow_symlinks=False) and os.path.isfile(os.path.join(e.path, MANIFEST)):
            out.append((int(m.group(1)), e.name))
    return sorted(out)


@dataclass
class Opened:
    """One generation of an index folder, opened: where its parts lie, its manifest (as found, unchecked), its
    number, and the lease that keeps it from removal while the reader lives."""
    root: Path
    parts: Path
    manifest_path: Path
    number: int
    lease: Lease | None
    data: bytes | None  # the manifest's bytes, read under the lease (None: unreadable; the check says why)

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()


def _dead(name: str) -> bool:
    """Whether the writer of the hidden folder ``name`` is gone (a killed process, or a writer of this one that
    stopped without finishing)."""
    m = _BUILDING_RE.match(name)
    if not m:
        return False
    pid = int(m.group(2))
    return name not in _WRITING if pid == os.getpid() else not pid_alive(pid)


def _finished(folder: Path, name: str) -> bool:
    """Whether ``folder`` holds the whole generation ``name``: its manifest, naming it, and every part it records
    of the size and checksum recorded."""
    from retr.retrieval.artifacts import check_checksums

    try:
        manifest = json.loads(_manifest_bytes(folder))
    except (OSError, ValueError, UnicodeDecodeError, RetrError):
        return False
    if not isinstance(manifest, dict) or manifest.get("dir") != name or not isinstance(manifest.get("files"), dict):
        return False
    files = manifest["files"]
    sized = {k: v for k, v in files.items() if isinstance(v, dict) and "bytes" in v}
    try:
        if check_checksums(folder, sized) is not None:
            return False
        for rel, info in files.items():
            if rel not in sized and hashlib.sha256((folder / rel).read_bytes()).hexdigest() != info.get("sha256"):
                return False
    except (OSError, RetrError, AttributeError):
        return False
    return True


def roll_forward(root: Path) -> int:
    """Give a generation that a dead writer finished but did not rename its final name (a rename only: readers
    may do it); return how many."""
    n = 0
    for e in list(os.scandir(root)) if root.is_dir() else []:
        m = _BUILDING_RE.match(e.name)
        if not m or m.group(3) != "building" or not _dead(e.name):
            continue
        name = GEN_DIR.format(int(m.group(1)))
        if (root / name).exists() or not _finished(Path(e.path), name):
            continue
        with contextlib.suppress(OSError):  # another process did it first, or a read-only folder
            fsync_tree(Path(e.path))
            os.rename(e.path, root / name)
            n += 1
            logger.warning("%s: generation %s was written whole by a writer that died before renaming it: recovered",
                           root, name)
    return n


def open_generation(root: Path) -> Opened:
    """The newest complete generation of the index folder ``root``, leased (its manifest is checked by the caller)."""
    root = Path(root)
    for attempt in range(OPEN_TRIES):
        if attempt:
            time.sleep(min(0.001 * attempt, 0.02))
        if not root.is_dir():
            recover_swap(root)
        if attempt == 0:
            roll_forward(root)
        try:
            data, pointer = _read_pointer(root)
        except FileNotFoundError:
            if root.is_dir() and complete_generations(root):
                continue  # published by a writer that is replacing it right now
            return Opened(root, root, root / MANIFEST, 0, None, None)  # the manifest check says what is missing
        except OSError:
            return Opened(root, root, root / MANIFEST, 0, None, None)
        name = pointer.get("dir") if pointer is not None else None
        newest = complete_generations(root)
        number = pointer.get("generation", 0) if pointer is not None else 0
        if newest and isinstance(number, int) and newest[-1][0] > number:
            name = newest[-1][1]  # written whole by a writer that died (or is) before publishing it: the newer one
        if name is None:  # format 1 / a fresh build: the generation lives at the root
            try:
                lease = Lease(root, follow=True)
            except OSError:
                continue  # a writer is removing the root's parts, superseded: read the pointer again
            if _manifest_bytes(root) != data:
                lease.release()
                continue
            return Opened(root, root, root / MANIFEST, number if isinstance(number, int) else 0, lease, data)
        try:
            name = generation_dir(name)
        except ValueError as e:
            raise RetrError(f"{root / MANIFEST}: 'dir' {e}: the index is damaged; rebuild it") from None
        parts = root / name
        try:
            lease = Lease(parts)
        except FileNotFoundError:
            if _manifest_bytes(root) == data and not [g for g in newest if g[1] == name]:
                raise RetrError(f"{parts}: missing: the generation {root / MANIFEST} names is gone; rebuild the "
                                f"index with `retr index`") from None
            continue
        except OSError:
            continue  # being removed (superseded): read the pointer again
        same = False
        try:
            same = os.stat(parts, follow_symlinks=False).st_ino == lease.inode
            own = _manifest_bytes(parts) if same else b""
        except FileNotFoundError:
            if same and _manifest_bytes(root) == data:  # published, held, and yet without its manifest
                lease.release()
                raise RetrError(f"{parts / MANIFEST}: missing: the index is damaged; rebuild it with `retr index`") \
                    from None
            same = False
        except OSError:
            same = False
        if not same:
            lease.release()
            continue
        return Opened(root, parts, parts / MANIFEST, generation_number(name), lease, own)
    raise RetrError(f"{root}: no generation could be opened in {OPEN_TRIES} tries: writers replace it faster than it "
                    f"opens")


# -- writers: under the folder's writer lock ---------------------------------------------------------------------
def current_number(root: Path) -> int | None:
    """The number of the generation published at ``root`` (None: no index there)."""
    try:
        _, pointer = _read_pointer(root)
    except OSError:
        return None
    if pointer is None:
        return None
    n = pointer.get("generation", 0)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0


def recover(root: Path) -> None:
    """Under the writer lock: publish a complete generation newer than the pointer (its writer died before
    publishing it), and remove what writers that died left unfinished (never a complete generation)."""
    roll_forward(root)
    for e in list(os.scandir(root)) if root.is_dir() else []:
        m = _BUILDING_RE.match(e.name)
        if m and (m.group(3) == "removing" or _dead(e.name)):
            shutil.rmtree(e.path, ignore_errors=True)
            logger.info("removed %s, left unfinished by a writer that died", e.path)
    newest = complete_generations(root)
    current = current_number(root)
    if newest and (current is None or newest[-1][0] > current):
        publish(root, newest[-1][1])
        logger.warning("%s: generation %d was written whole but not published (its writer died): published now",
                       root, newest[-1][0])


def next_number(root: Path) -> int:
    numbers = [n for n, _ in complete_generations(root)]
    current = current_number(root)
    for e in os.scandir(root) if root.is_dir() else []:
        m = _BUILDING_RE.match(e.name)
        if m:
            numbers.append(int(m.group(1)))
    return max([*numbers, -1 if current is None else current]) + 1


def publish(root: Path, name: str) -> None:
    """The commit: ``root/manifest.json`` replaced, in one atomic rename, by the manifest of generation ``name``."""
    data = _manifest_bytes(root / name)
    atomic_write_bytes(root / MANIFEST, data, durable=True)


@contextlib.contextmanager
def new_generation(root: Path) -> Iterator[tuple[Path, int, str]]:
    """Under the writer lock of ``root`` (an index folder): yield ``(folder, number, name)`` to write the next
    generation into (its manifest last, with ``dir``: ``name`` and ``generation``: ``number``). On success it is
    made durable, renamed to ``name`` and published (the caller then ``collect``s, once it holds no generation
    itself). If the body raises, the unfinished folder is removed and the published generation is untouched."""
    root = Path(root)
    current = current_number(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        recover(root)
        number = next_number(root)
        name = GEN_DIR.format(number)
        tmp = root / f".{name}.{os.getpid()}.building"
        tmp.mkdir()
    except OSError as e:
        raise _unwritten(root, current, e) from None
    _WRITING.add(tmp.name)
    try:
        yield tmp, number, name
        if not (tmp / MANIFEST).is_file():
            raise RuntimeError(f"{tmp}: the generation was written without its manifest")
        fsync_tree(tmp)
        os.rename(tmp, root / name)
        fsync_tree(root, files=False)
    except OSError as e:  # a full disk, a read-only folder: nothing of the new generation is left
        shutil.rmtree(tmp, ignore_errors=True)
        raise _unwritten(root, current, e) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        _WRITING.discard(tmp.name)
    try:
        publish(root, name)
    except OSError as e:  # the pointer could not be replaced: the new generation goes too (no reader was told of it)
        fd = _exclusive(root / name)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.rename(root / name, root / f".{name}.{os.getpid()}.removing")
            os.close(fd)
            shutil.rmtree(root / f".{name}.{os.getpid()}.removing", ignore_errors=True)
        raise _unwritten(root, current, e) from None


def _unwritten(root: Path, current: int | None, e: OSError) -> RetrError:
    """The one line for a change that could not be written (a full disk, a read-only folder, a FAISS write)."""
    where = f" ({Path(e.filename).name})" if getattr(e, "filename", None) else ""
    kept = "" if current is None else f" (generation {current} is still the one published)"
    return RetrError(f"{root}: the change could not be written: {e.strerror or e}{where}; the index is unchanged"
                     f"{kept}: free space or make the folder writable, then run it again")


def collect(root: Path) -> int:
    """Remove the superseded generations of ``root`` that no reader holds (the root's own parts included, once a
    generation folder is published); return how many were removed."""
    current = current_number(root)
    _, pointer = _read_pointer(root)
    published = pointer.get("dir") if pointer else None
    if current is None or published is None:
        return 0
    removed = 0
    for number, name in complete_generations(root):
        if number >= current or name == published:
            continue
        fd = _exclusive(root / name)
        if fd is None:
            logger.info("%s: generation %d is held by a reader: kept", root, number)
            continue
        try:
            doomed = root / f".{name}.{os.getpid()}.removing"
            os.rename(root / name, doomed)
        finally:
            os.close(fd)
        shutil.rmtree(doomed, ignore_errors=True)
        removed += 1
    stale = [e for e in os.scandir(root) if ROOT_PART_RE.match(e.name)]
    if stale:
        fd = _exclusive(root, follow=True)
        if fd is None:
            logger.info("%s: the generation at its root is held by a reader: kept", root)
        else:
            try:
                for e in stale:
                    if e.is_dir(follow_symlinks=False):
                        shutil.rmtree(e.path, ignore_errors=True)
                    else:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(e.path)
                removed += 1
            finally:
                os.close(fd)
    return removed


def recover_swap(target: Path) -> Path | None:
    """An index folder lost between the two renames of an older retr's folder swap (``.NAME.old-PID`` and
    ``.NAME.PID.*.building`` left beside it, both complete): the newer complete copy renamed back into place."""
    target = Path(target).absolute()
    if target.exists() or not target.parent.is_dir():
        return None
    copies = []
    for p in target.parent.glob(f".{target.name}.*"):
        rest = p.name[len(target.name) + 2:]
        if (rest.endswith(".building") or rest.startswith("old-")) and (p / MANIFEST).is_file():
            copies.append(((p / MANIFEST).stat().st_mtime_ns, rest.endswith(".building"), p))
    if not copies:
        return None
    newest = max(copies)[2]
    try:
        os.rename(newest, target)
    except OSError:
        return None  # another process recovered it first
    logger.warning("%s: recovered from %s (a writer died between the two renames of its swap)", target, newest.name)
    return newest
