"""Compiled OpenVINO models kept for the next process (``$RETR_CACHE/compiled``): a search process compiles its
query graph anew, and reading a compiled model back can be faster than compiling it (MiniLM's static int8 graph as
one stream on 2 EPYC cores: ~0.12 s mapped, checked and imported against ~0.3 s compiled).

Each entry is a folder like every cached graph: a manifest (what it was compiled from and with, and its blob's
size and sha256) and the blob (``CompiledModel.export_model``), published in one rename and checked in full on
every read. A damaged entry is discarded with a warning and the model compiled again (OpenVINO's own model cache,
used before, read back a blob with flipped bytes without a word and ranked with it). Where reading an entry back
was measured no faster than compiling the model (the first read against the compilation that wrote it), the blob
is dropped and the entry keeps only that note: the model is compiled from then on (the first read follows the
write, so its blob is usually still in the page cache; a read from a slow disk could drop a blob that pays). Writing an entry removes the
entries it supersedes: another of the same graph folder made from an earlier export of it or by another OpenVINO
on the same CPU, and any whose graph folder is gone from the cache."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import mmap
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from retr.retrieval.artifacts import atomic_dir, new_manifest, open_regular, read_small
from retr.retrieval.backends.timing import recorded
from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

KIND = "retr-compiled-model"
BLOB = "model.blob"
MANIFEST = "manifest.json"
MAX_MANIFEST = 1 << 20  # an entry's manifest larger than this is damaged
# what names an entry (``_identity``): the graph's content (its manifest's digest), never where the cache lies (a
# copied $RETR_CACHE reads its entries back); the graph folder's path is recorded beside it, for ``_prune``
IDENTITY = ("source_manifest_sha256", "config", "cpu", "openvino")


def _sha256(data) -> str:
    return hashlib.sha256(data).hexdigest()


def _tensor(blob: mmap.mmap):
    """The blob as an OpenVINO tensor (copied: OpenVINO shares only writable memory)."""
    import numpy as np
    import openvino as ov

    return ov.Tensor(np.frombuffer(blob, dtype=np.uint8))


def _openvino_version() -> str:
    import openvino as ov

    return ov.get_version()


@dataclass(frozen=True)
class CompiledStore:
    """Where one graph's compiled models are kept: ``root`` (the cache's ``compiled`` folder), ``source`` (the
    graph's cache folder, whose manifest records its files' checksums) and the CPU they are compiled for."""
    root: Path
    source: Path
    cpu: str

    def _source_digest(self) -> str | None:
        try:
            return _sha256((self.source / MANIFEST).read_bytes())
        except OSError:
            return None

    def folder(self, source_digest: str, config: dict) -> Path:
        """The entry of this graph (as its manifest now reads) compiled with ``config`` by this OpenVINO here: named
        by its graph folder and a digest of what its manifest must record (``_identity``)."""
        return self._folder(self._identity(source_digest, config))

    def _folder(self, identity: dict) -> Path:
        raw = json.dumps(identity, sort_keys=True)
        return self.root / f"{self.source.name}-{_sha256(raw.encode())[:16]}"

    def compile(self, core, model, config: dict):
        """``model`` compiled with ``config``: read back from its entry where one is kept (checked), else compiled
        and written for the next process (where the cache can be written)."""
        digest = self._source_digest()
        if digest is None:
            return core.compile_model(model, "CPU", config)
        identity = self._identity(digest, config)
        folder = self._folder(identity)
        meta, blob, read_s = _read(folder, identity)
        if meta is not None and blob is None:  # measured no faster to read than to compile here
            return core.compile_model(model, "CPU", config)
        if blob is not None:
            t0 = time.perf_counter()
            try:  # copied into the compiled model: the mapping is closed after
                compiled = core.import_model(_tensor(blob), "CPU", config)
            except Exception as e:  # noqa: BLE001 - a blob this OpenVINO cannot import is a damaged entry
                _discard(folder, str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
            else:
                read_s += time.perf_counter() - t0
                if not meta.get("read_seconds"):  # the first read: does keeping it pay?
                    _measured(folder, meta, read_s)
                return compiled
            finally:
                with contextlib.suppress(BufferError):  # still viewed (an exception's frames): closed when freed
                    blob.close()
        t0 = time.perf_counter()
        compiled = core.compile_model(model, "CPU", config)
        self._write(folder, compiled, identity, time.perf_counter() - t0)
        return compiled

    def _identity(self, digest: str, config: dict) -> dict:
        """What an entry's manifest must record to be this graph compiled with ``config`` here (``IDENTITY``)."""
        return dict(zip(IDENTITY, (digest, {k: str(v) for k, v in config.items()}, self.cpu, _openvino_version()),
                        strict=True))

    def _write(self, folder: Path, compiled, identity: dict, compile_s: float) -> None:
        try:
            with compiled.export_model().getbuffer() as blob, atomic_dir(folder) as tmp:  # the stream's own bytes
                (tmp / BLOB).write_bytes(blob)
                size = len(blob)
                meta = new_manifest(KIND, source=str(self.source.resolve()), **identity, compile_seconds=compile_s,
                                    files={BLOB: {"sha256": _sha256(blob), "bytes": size}})
                (tmp / MANIFEST).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        except OSError as e:  # a read-only or full cache: compiled again next time, nothing else lost
            logger.info("compiled model not kept in %s: %s", self.root, e.strerror or e)
            return
        logger.debug("compiled model kept: %s (%d bytes, compiled in %.2f s)", folder, size, compile_s)
        _prune(self.root, folder, meta)


def _read(folder: Path, identity: dict) -> tuple[dict | None, mmap.mmap | None, float]:
    """An entry's manifest, its blob mapped where kept (None: absent, or only the note that it is not kept; the
    caller closes it) and the seconds mapping and checking it took. An entry that is not what ``identity`` names
    (another graph's or options' entry in its place), whose manifest or blob is damaged, or a symlink in the
    entry's place, is discarded (``(None, None, 0)``)."""
    t0 = time.perf_counter()
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None, None, 0.0
    except OSError as e:  # a symlink or a file in the entry's place
        logger.warning("kept compiled model %s is not a folder (%s): removed, the model is compiled again",
                       folder, e.strerror)
        with contextlib.suppress(OSError):
            folder.unlink()
        return None, None, 0.0
    blob = None
    try:
        meta = json.loads(read_small(MANIFEST, MAX_MANIFEST, dir_fd=dfd))
        if not isinstance(meta, dict) or meta.get("format") != KIND:
            raise ValueError("not a compiled model's manifest")
        named = {k: meta.get(k) for k in identity}
        if named != identity:
            wrong = ", ".join(k for k in identity if named[k] != identity[k])
            raise ValueError(f"its manifest names another {wrong}")
        recorded(meta.get("compile_seconds"), positive=True)  # ValueError: not a time that passed
        if "not_kept" in meta:  # the note that reading it back did not pay
            return meta, None, 0.0
        info = meta["files"][BLOB]
        blob = _map_at(dfd, BLOB)
        if len(blob) != info["bytes"]:
            raise ValueError(f"{BLOB} is {len(blob)} bytes, its manifest records {info['bytes']}")
        if _sha256(blob) != info["sha256"]:
            raise ValueError(f"{BLOB}'s content differs from the checksum in its manifest")
        return meta, blob, time.perf_counter() - t0
    except (OSError, ValueError, KeyError, TypeError, RetrError) as e:
        if blob is not None:
            blob.close()
        if _same_folder(folder, dfd):  # not another writer's entry published since it was opened
            _discard(folder, str(e))
        return None, None, 0.0
    finally:
        os.close(dfd)


def _map_at(dfd: int, name: str) -> mmap.mmap:
    """``name`` in the folder ``dfd``, a regular file (``open_regular``), mapped read-only (hashed and imported
    without a copy of its own: ~0.12 against ~0.15 s read into memory for MiniLM's 59 MB int8 blob)."""
    fd = open_regular(name, dfd)
    try:
        return mmap.mmap(fd, 0, prot=mmap.PROT_READ)  # an empty file: ValueError
    finally:
        os.close(fd)


def _same_folder(folder: Path, dfd: int) -> bool:
    try:
        return os.stat(folder).st_ino == os.fstat(dfd).st_ino
    except OSError:
        return False


def _discard(folder: Path, why: str) -> None:
    logger.warning("kept compiled model %s is damaged (%s): discarded, the model is compiled again", folder, why)
    shutil.rmtree(folder, ignore_errors=True)


def _measured(folder: Path, meta: dict, read_s: float) -> None:
    """After an entry's first read: keep its blob where reading it back took less time than compiling did, else
    replace the entry by the note that it did not pay (the model is compiled from then on)."""
    compile_s = meta["compile_seconds"]  # checked by ``_read``
    kept = read_s < compile_s
    logger.debug("compiled model %s read back in %.3f s, compiled in %.3f s: %s", folder, read_s, compile_s,
                 "kept" if kept else "not kept")
    note = {**meta, "read_seconds": read_s}
    if not kept:
        note.pop("files")
        note["not_kept"] = f"read back in {read_s:.3f} s, compiled in {compile_s:.3f} s"
    with contextlib.suppress(OSError), atomic_dir(folder) as tmp:
        if kept:
            os.link(folder / BLOB, tmp / BLOB)  # the checked blob itself, not a copy
        (tmp / MANIFEST).write_text(json.dumps(note, indent=2) + "\n", encoding="utf-8")


def _prune(root: Path, keep: Path, ours: dict) -> None:
    """Remove the entries ``keep`` (whose manifest is ``ours``) supersedes (its graph folder's from an earlier
    export of it, or by another OpenVINO on this CPU), entries whose graph folder is gone, and the blobs OpenVINO's
    own cache left here."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for p in entries:
        if p == keep or p.name.startswith("."):
            continue
        if p.is_file() and p.suffix == ".blob":  # OpenVINO's CACHE_DIR, where an earlier retr kept them
            with contextlib.suppress(OSError):
                p.unlink()
            continue
        try:
            if p.is_symlink() or not p.is_dir():
                continue
            theirs = json.loads(read_small(p / MANIFEST))
            # its graph folder: where it was written, or of the same name here (a copied cache)
            name = Path(theirs["source"]).name
            gone = not Path(theirs["source"]).is_dir() and not (Path(ours["source"]).parent / name).is_dir()
            superseded = name == Path(ours["source"]).name and (
                theirs["source_manifest_sha256"] != ours["source_manifest_sha256"]
                or (theirs["openvino"] != ours["openvino"] and theirs["cpu"] == ours["cpu"])
                or all(theirs.get(k) == ours[k] for k in IDENTITY))  # the same entry under an earlier name
        except (OSError, ValueError, KeyError, TypeError, RetrError):
            continue  # not an entry of this kind, or another writer's being replaced: left alone
        if gone or superseded:
            logger.debug("compiled model %s removed (%s)", p, "its graph is gone" if gone else "superseded")
            shutil.rmtree(p, ignore_errors=True)


__all__ = ["BLOB", "KIND", "CompiledStore"]
