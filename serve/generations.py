"""The generation of an index folder a server answers with, and the next one, opened off the event loop.

A thread of its own looks at the folder's ``manifest.json`` every ``POLL_S``. When a new generation is published
there (``retr add``, a rebuild: an atomic rename), that thread opens it and warms it (``warm_up``: every part
loaded, the cross-encoder too) while requests are still answered by the served one; then one reference swap.
A request holds the generation it started on until it ends (``acquire``/``release``, ``lease``): the old
generation is closed (its lease on the folder released, so that a writer may remove it) once the last of them
ends. A new generation that does not open is refused, logged once, and the last good one stays served (``/healthz``
says so); it is tried again when the manifest changes, or after ``RETRY_REFUSED_S`` (a part repaired in place).
The first open is the caller's: a server never starts on a damaged folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from retr.indexes.searcher import Searcher
from retr.retrieval.artifacts import read_small
from retr.retrieval.errors import RetrError
from retr.serve.config import ServeConfig

logger = logging.getLogger(__name__)

POLL_S = 0.5  # how often the watcher looks at the manifest
RETRY_REFUSED_S = 5.0


def warm_up(searcher: Searcher, cfg: ServeConfig) -> None:
    """Every part of ``searcher`` loaded now, from its generation, not by the first request that needs it."""
    searcher.search_many(["retr"], 1, "hybrid" if searcher.index.has_bm25 else "dense")
    if cfg.rerank is not None:  # the check stored beside the index (or carried over) is read as it loads
        searcher.reranker(cfg.rerank.model)


def _generation_on_disk(folder: Path) -> int | None:
    try:
        manifest = json.loads(read_small(folder / "manifest.json"))  # never a FIFO or device: it would hang
        return int(manifest.get("generation", 0))
    except (OSError, ValueError, TypeError, AttributeError, RetrError):
        return None


@dataclass
class Served:
    """One opened generation, and how many requests use it."""
    searcher: Searcher
    stamp: tuple | None
    users: int = 0
    retired: bool = False  # another generation is served now: closed when its last user is done


class Generations:
    """The served generation of ``folder`` and the watcher that replaces it (see the module's docstring)."""

    def __init__(self, folder: Path, cfg: ServeConfig, poll_s: float = POLL_S):
        self.folder = Path(folder)
        self.cfg = cfg
        self.opened = 1  # generations this server has opened
        # a generation on disk that did not open (the last good one is served meanwhile): its manifest's generation
        # where it could be read, the error, and when this manifest was first refused (time.time())
        self.refused: dict | None = None
        self._refused_stamp = None
        self._retry_at = 0.0
        stamp = self._manifest_stamp()  # before the open: a change during it is seen by the watcher's first look
        searcher = Searcher(self.folder, cfg.encoder, cfg.pipeline, cfg.rerank)
        try:
            warm_up(searcher, cfg)
        except BaseException:
            searcher.close()
            raise
        self._served = Served(searcher, stamp)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._watcher = threading.Thread(target=self._watch, args=(poll_s,), name="retr-generations", daemon=True)
        self._watcher.start()

    @property
    def number(self) -> int:
        """The served generation, as its manifest says (its count of changes: 0 for a fresh build)."""
        return self._served.searcher.index.generation

    def acquire(self) -> Served:
        """The served generation, held for a request until ``release``."""
        with self._lock:
            served = self._served
            served.users += 1
        return served

    def release(self, served: Served) -> None:
        with self._lock:
            served.users -= 1
            done = served.retired and not served.users
        if done:
            served.searcher.close()

    @contextlib.contextmanager
    def lease(self) -> Iterator[Searcher]:
        served = self.acquire()
        try:
            yield served.searcher
        finally:
            self.release(served)

    def close(self) -> None:
        """Stop watching, and close the served generation once its requests are done."""
        self._stopped.set()
        self._watcher.join(10)
        self._retire(self._served)

    def _manifest_stamp(self):
        try:
            st = os.stat(self.folder / "manifest.json")
        except OSError:
            return None  # mid-swap or removed: keep serving the generation we have
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _watch(self, poll_s: float) -> None:
        while not self._stopped.wait(poll_s):
            try:
                self._look()
            except Exception:  # noqa: BLE001 - logged; the watcher keeps watching
                logger.exception("%s: looking for a new generation failed", self.folder)

    def _look(self) -> None:
        stamp = self._manifest_stamp()
        if stamp is None or stamp == self._served.stamp or \
                (stamp == self._refused_stamp and time.monotonic() < self._retry_at):
            return
        try:
            searcher = self._served.searcher.reopened()
            try:
                warm_up(searcher, self.cfg)
            except BaseException:
                searcher.close()
                raise
        except Exception as e:  # noqa: BLE001 - whatever stops the new generation, the last good one is served
            message = str(e) if isinstance(e, RetrError) else f"{type(e).__name__}: {e}"
            if stamp != self._refused_stamp:
                logger.warning("%s: a new generation on disk was refused, generation %d is still served: %s",
                               self.folder, self.number, message)
                self.refused = {"generation": _generation_on_disk(self.folder), "error": message,
                                "since": time.time()}
                self._refused_stamp = stamp
            self._retry_at = time.monotonic() + RETRY_REFUSED_S
            return
        if self._stopped.is_set():
            searcher.close()
            return
        with self._lock:
            old, self._served = self._served, Served(searcher, stamp)
            self.opened += 1
            self.refused = self._refused_stamp = None
        self._retire(old)
        logger.info("%s changed: generation %d opened", self.folder, self.number)

    def _retire(self, served: Served) -> None:
        """``served`` closed now, or by the last request that holds it."""
        with self._lock:
            served.retired = True
            served.users += 1
        self.release(served)
