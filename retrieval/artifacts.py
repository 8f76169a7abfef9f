"""What every retr artifact (index folder, cache entry, exported graph, model, report) is made of:
atomic writes, a manifest, checksums of its parts, and a lock for its writer.

The lowest layer with ``errors`` and ``types``: it imports nothing of retr's but the error type.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import json
import logging
import os
import platform
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
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


def atomic_write_text(path: Path, text: str, output: bool = False) -> None:
    """``path`` replaced by ``text`` (UTF-8) in one rename; ``output``: see ``_atomic_write``."""
    data = text.encode("utf-8")
    _atomic_write(path, lambda fh: fh.write(data), output=output)


def atomic_write_lines(path: Path, lines: Iterable[str], batch: int = 4096, output: bool = False) -> None:
    """``path`` replaced in one rename by ``lines`` (UTF-8), written ``batch`` lines at a time as they come: a run
    file of 300,000 lines is never held whole as one string and its bytes (~40 MiB of a first `retr eval`'s peak).
    An error while the lines are made leaves ``path`` as it was. ``output``: see ``_atomic_write``."""
    def chunks(fh) -> None:
        it = iter(lines)
        while part := list(itertools.islice(it, batch)):
            fh.write("".join(part).encode("utf-8"))

    _atomic_write(path, chunks, output=output)


def not_a_file(path: Path) -> str | None:
    """What ``path`` is where a file to read was expected and it is not a regular file: a folder, or a device,
    FIFO or socket; None where nothing is there."""
    if not path.exists():
        return None
    return "a folder" if path.is_dir() else "not a regular file (a device, FIFO or socket)"


def check_output(out: str | os.PathLike | None, flag: str = "--out", files: dict | None = None,
                 folders: dict | None = None) -> None:
    """A one-line ``RetrError``, before any work, where writing the file ``out`` would replace one of a command's
    inputs or could not be done: ``files`` (what each is -> its path or paths) are files ``out`` must not be,
    ``folders`` ones it must not lie in (a dataset's, an index's: a report written over ``corpus.jsonl`` or an
    index's ``docstore.jsonl``); and ``out``'s folder, or the nearest one that exists, must be writable."""
    if not out:
        return
    target = Path(os.path.abspath(out))

    def each(paths):
        return [p for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths or ()) if p]

    for what, paths in (files or {}).items():
        for path in each(paths):
            if target.exists() and os.path.exists(path) and os.path.samefile(target, path):
                raise RetrError(f"{out}: {flag} names the {what} read ({path}), which it would replace: "
                                f"give another path")
    for what, paths in (folders or {}).items():
        for path in each(paths):
            if os.path.isdir(path) and (Path(os.path.realpath(target.parent)) / target.name).is_relative_to(
                    os.path.realpath(path)):
                raise RetrError(f"{out}: {flag} lies in the {what} read ({path}), whose files it could replace: "
                                f"give a path outside it")
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
        raise RetrError(f"{out}: cannot be written ({folder} is not a folder this user can write in)")


def atomic_write_bytes(path: Path, data: bytes, durable: bool = False) -> None:
    """``path`` replaced by ``data`` in one rename (``durable``: the data, then the rename, synced to disk)."""
    _atomic_write(path, lambda fh: fh.write(data), durable)


def _atomic_write(path: Path, write: Callable[[Any], object], durable: bool = False, output: bool = False) -> None:
    """``path`` replaced, in one rename, by a file ``write`` fills (given its binary handle); on any error the
    temporary file goes and ``path`` stays as it was. ``output``: a file the user named (a run, a report), not
    one of retr's own: a device or FIFO there is written into, never replaced (`--out /dev/null` as root replaced
    /dev/null), and a folder or a path that cannot be written is a one-line ``RetrError``; retr's own files (the
    cache, an index's) replace whatever stands in their place, and a failure to write them is an ``OSError``."""
    path = Path(path)
    if not output:
        _replace(path, write, durable)
        return
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise RetrError(f"{path}: is a folder: give the path of a file to write")
    if mode is not None and not stat.S_ISREG(mode):  # /dev/null, /dev/stdout, a FIFO: written into, never replaced
        try:  # (a FIFO no process reads would block forever)
            fd = os.open(path, os.O_WRONLY | (os.O_NONBLOCK if stat.S_ISFIFO(mode) else 0))
        except OSError as e:
            raise RetrError(f"{path}: cannot be written ({'a FIFO no process reads' if e.errno == errno.ENXIO else e.strerror})"
                            f": nothing written") from None
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        return
    try:
        _replace(path, write, durable)
    except OSError as e:  # a folder that cannot be written, a full disk
        raise RetrError(f"{path}: cannot be written ({e.strerror or e}): nothing written") from None


def _replace(path: Path, write: Callable[[Any], object], durable: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        _chmod_default(Path(tmp), is_dir=False)
        os.replace(tmp, path)
        if durable:
            fsync_tree(path.parent, files=False)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def fsync_tree(folder: Path, files: bool = True) -> None:
    """Sync ``folder`` to disk: its files and sub-folders (``files``), then the folder itself."""
    folder = Path(folder)
    if files:
        for root, _dirs, names in os.walk(folder):
            for name in names:
                _fsync(os.path.join(root, name), os.O_NOFOLLOW)
            _fsync(root, os.O_DIRECTORY)
    _fsync(folder, os.O_DIRECTORY)


def _fsync(path: str | Path, flags: int) -> None:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
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
    """Remove what builds of ``target`` killed before they finished left beside it; return how many. Where
    ``target`` itself is missing (a writer died between the two renames of the swap), nothing is removed: the
    leftovers are then its only complete copies (``retr.indexes.generations.recover_swap`` puts one back)."""
    n = 0
    if not Path(target).exists():
        return 0
    for path, pid in _leftovers(target):
        if pid != os.getpid() and not pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            n += 1
    if n:
        logger.info("removed %d unfinished build(s) of %s left by killed processes", n, target)
    return n


def _holder(lock_path: Path) -> str:
    """What the writer holding ``lock_path`` wrote into it: ``" (`retr OP`, pid N)"``, or nothing."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        op, _, pid = lock_path.read_text(encoding="utf-8").strip().partition(" ")
        return f" (`retr {op}`, pid {pid})" if op.isidentifier() and pid.isdigit() else ""
    return ""


WRITER_LOCK = ".retr-writer.lock"  # inside an index folder: one file, whatever path reaches the folder


@contextlib.contextmanager
def writer_lock(target: Path, wait: bool = False, op: str = "index") -> Iterator[None]:
    """One writer of ``target`` at a time, found by the folder's identity: flocks on ``.NAME.lock`` beside its real
    path (symlinks, ``..`` resolved) and, where it holds a manifest, on ``WRITER_LOCK`` inside it (one file through
    any path, a bind mount too); removed afterwards. ``op``: ``index``, ``add``, ... (named to another writer)."""
    given = Path(target).absolute()
    real = given.resolve()
    real.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as held:
        held.enter_context(_flock(real.with_name(f".{real.name}.lock"), given, wait, op))
        if (real / MANIFEST).is_file():
            held.enter_context(_flock(real / WRITER_LOCK, given, wait, op))
        yield


@contextlib.contextmanager
def _flock(lock_path: Path, target: Path, wait: bool, op: str) -> Iterator[None]:
    while True:
        try:
            fh = open(lock_path, "a+b", buffering=0)  # noqa: SIM115 - held; unbuffered: a full disk fails here
        except OSError as e:
            raise RetrError(f"{target}: cannot {op} it: {e.strerror} ({lock_path.parent}); it is unchanged") from None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as e:
            fh.close()
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            advice = "or choose another --out" if op == "index" else f"then run `retr {op}` again"
            raise RetrError(f"{target}: another retr process is writing it now{_holder(lock_path)}; cannot "
                            f"{op} it meanwhile: wait for it to finish, {advice}") from None
        with contextlib.suppress(FileNotFoundError):  # the file we locked may have been unlinked by the writer
            if os.fstat(fh.fileno()).st_ino == os.stat(lock_path).st_ino:  # before us: lock the current one
                break
        fh.close()
    with contextlib.suppress(OSError):
        fh.seek(0)
        fh.truncate()
        fh.write(f"{op} {os.getpid()}\n".encode())
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


def open_regular(path: Path, dir_fd: int | None = None) -> int:
    """A read-only fd on ``path``, a regular file: a symlink, FIFO, device or folder is refused without being
    opened for reading (O_NOFOLLOW | O_NONBLOCK: a FIFO never blocks the open). ``dir_fd``: ``path`` is relative
    to that open folder (the same folder throughout, even where its path is replaced meanwhile)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RetrError(f"{path}: a symlink, not a regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RetrError(f"{path}: not a regular file")
    return fd


MAX_SMALL_FILE = 64 << 20  # a manifest or other small part larger than this is not read


def read_small(path: Path, limit: int = MAX_SMALL_FILE, dir_fd: int | None = None) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (``open_regular``: never a symlink, FIFO or
    device; ``dir_fd`` as there); a ``RetrError`` naming it otherwise, ``FileNotFoundError`` where it does not
    exist."""
    with os.fdopen(open_regular(path, dir_fd), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise RetrError(f"{path}: {size} bytes, more than the {limit} a retr manifest may hold")
        return fh.read(limit + 1)[:limit]


def file_sha256(path: Path, limit: int | None = None) -> str:
    """sha256 of a regular file (never a special one: ``open_regular``); ``limit``: read at most this many bytes
    (its recorded size: a file that grows is not read on forever)."""
    h = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as fh:
        left = limit
        while left is None or left > 0:
            chunk = fh.read(1 << 20 if left is None else min(1 << 20, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


def confined(folder: Path, rel: object) -> Path:
    """``folder / rel`` for a relative path ``rel`` that stays inside ``folder`` through no symlink; else a
    ``RetrError`` naming it (absolute, ``..``, empty, a symlink on the way)."""
    folder = Path(folder)
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise RetrError(f"{folder}: its manifest names a path {str(rel)[:60]!r}: not a relative path")
    parts = Path(rel).parts
    if Path(rel).is_absolute() or any(p in ("..", ".", "") for p in parts) or rel.endswith("/"):
        raise RetrError(f"{folder}: its manifest names {rel!r}: a path outside the folder (only relative paths "
                        f"inside it are read)")
    path = folder
    for part in parts[:-1]:
        path = path / part
        if path.is_symlink():
            raise RetrError(f"{path}: a symlink: an index's parts are read only from inside its folder")
    return folder / rel


def checksums(folder: Path, names: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{relative path: {"sha256", "bytes"}}`` of the files of ``folder`` (all but the manifest, or ``names``)."""
    folder = Path(folder)
    files = ([folder / n for n in names] if names is not None else
             sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST))
    return {str(p.relative_to(folder)): {"sha256": file_sha256(p), "bytes": p.stat().st_size} for p in files}


def check_sizes(folder: Path, recorded: dict[str, dict[str, Any]]) -> str | None:
    """The first part of ``folder`` missing or of another size than recorded (cheap: stat only), or None."""
    for rel, info in recorded.items():
        try:
            p = confined(Path(folder), rel)
        except RetrError as e:
            return str(e)
        if not isinstance(info, dict):
            return f"{p}: its manifest entry is not an object"
        try:
            st = p.lstat()
        except OSError:
            return f"{p}: missing"
        if stat.S_ISLNK(st.st_mode):
            return f"{p}: a symlink, not a regular file"
        if not stat.S_ISREG(st.st_mode):
            return f"{p}: not a regular file"
        size = st.st_size
        if size != info.get("bytes"):
            return f"{p}: {size} bytes, its manifest records {info.get('bytes')!r}"
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
        if file_sha256(Path(folder) / rel, limit=info.get("bytes")) != info.get("sha256"):
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
