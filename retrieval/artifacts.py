"""What every retr artifact (index folder, cache entry, exported graph, model, report) is made of:
atomic writes, a manifest, checksums of its parts, and a lock for its writer.

The lowest layer with ``errors`` and ``types``: it imports nothing of retr's but the error type.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
_VERSIONED = ("retr", "faiss-cpu", "torch", "sentence-transformers", "transformers", "bm25s", "numpy", "onnxruntime",
              "openvino")


def cache_home() -> Path:
    """``$RETR_CACHE`` (default ``~/.cache/retr``): embeddings, exported graphs, eval indexes."""
    return Path(os.environ.get("RETR_CACHE") or Path.home() / ".cache" / "retr").expanduser()


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in _VERSIONED:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def new_manifest(kind: str, **fields: Any) -> dict[str, Any]:
    return {"format": kind, "format_version": FORMAT_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields, "versions": versions()}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _chmod_default(path: Path, is_dir: bool) -> None:
    """mkstemp/mkdtemp create 0600/0700; a finished artifact gets the permissions the umask gives."""
    with contextlib.suppress(OSError):
        os.chmod(path, (0o777 if is_dir else 0o666) & ~_umask())


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        _chmod_default(Path(tmp), is_dir=False)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _leftovers(target: Path) -> Iterator[tuple[Path, int]]:
    """``(path, pid)`` of the temporary folders a build of ``target`` leaves while it runs."""
    for p in target.parent.glob(f".{target.name}.*"):
        rest = p.name[len(target.name) + 2:]
        head, _, _tail = rest.partition(".")
        if rest.endswith(".building") and head.isdigit():
            yield p, int(head)
        elif head.startswith("old-") and head[4:].isdigit():
            yield p, int(head[4:])


def remove_stale(target: Path) -> int:
    """Remove what builds of ``target`` killed before they finished left beside it; return how many."""
    n = 0
    for path, pid in _leftovers(target):
        if pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            n += 1
    if n:
        logger.info("removed %d unfinished build(s) of %s left by killed processes", n, target)
    return n


@contextlib.contextmanager
def writer_lock(target: Path, wait: bool = False) -> Iterator[None]:
    """One writer of ``target`` at a time (an flock on ``.NAME.lock`` beside it, removed afterwards)."""
    target = Path(target).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.with_name(f".{target.name}.lock")
    while True:
        fh = open(lock_path, "a+")  # noqa: SIM115 - held for the body
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as e:
            fh.close()
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise RetrError(f"{target}: another retr process is writing it now; wait for it to finish or "
                                f"choose another output") from None
            raise
        try:  # the file we locked may have been unlinked by the writer before us: lock the current one
            same = os.fstat(fh.fileno()).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        fh.close()
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)
        fh.close()


@contextlib.contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``; on success it replaces ``target``.

    If the body raises, the temporary folder is removed and an existing ``target`` is untouched. The
    temporary folder's name carries the writer's pid, so that a later writer of the same target can remove
    what a killed one left (``remove_stale``).
    """
    target = Path(target).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".building", dir=target.parent))
    try:
        yield tmp
        for p in (tmp, *tmp.rglob("*")):
            _chmod_default(p, p.is_dir())
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            try:
                os.replace(tmp, target)
            except BaseException:
                os.replace(old, target)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def checksums(folder: Path, names: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{relative path: {"sha256", "bytes"}}`` of the files of ``folder`` (all but the manifest, or ``names``)."""
    folder = Path(folder)
    files = ([folder / n for n in names] if names is not None else
             sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST))
    return {str(p.relative_to(folder)): {"sha256": file_sha256(p), "bytes": p.stat().st_size} for p in files}


def check_sizes(folder: Path, recorded: dict[str, dict[str, Any]]) -> str | None:
    """The first part of ``folder`` missing or of another size than recorded (cheap: stat only), or None."""
    for rel, info in recorded.items():
        p = Path(folder) / rel
        try:
            size = p.stat().st_size
        except OSError:
            return f"{p}: missing"
        if size != info.get("bytes"):
            return f"{p}: {size} bytes, its manifest records {info.get('bytes')}"
    return None


def check_checksums(folder: Path, recorded: dict[str, dict[str, Any]], hash_up_to: int | None = None) -> str | None:
    """The first part of ``folder`` whose size or sha256 differs from ``recorded``, or None. ``hash_up_to``:
    parts larger than this many bytes are checked by size only (a cheap check on every open)."""
    bad = check_sizes(folder, recorded)
    if bad:
        return bad
    for rel, info in recorded.items():
        if hash_up_to is not None and info.get("bytes", 0) > hash_up_to:
            continue
        if file_sha256(Path(folder) / rel) != info.get("sha256"):
            return f"{Path(folder) / rel}: its content differs from the checksum in its manifest"
    return None


def read_text(path: Path) -> str:
    """A text file's content, or a one-line ``RetrError`` naming it (missing, unreadable, not UTF-8)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise RetrError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise RetrError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def write_json(path: Path, obj: Any) -> None:
    Path(path).write_text(json.dumps(obj, indent=2, default=str) + "\n", encoding="utf-8")
