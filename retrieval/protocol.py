"""The one narrow protocol every retriever implements, and the per-stage timer they share."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Protocol, runtime_checkable

from retr.retrieval.types import Run


class StageTimer:
    """Accumulates wall time per named stage (seconds) for one call."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


@runtime_checkable
class Retriever(Protocol):
    """Ranks documents for queries.

    ``search`` returns a ``Run`` with an entry for every query id given (possibly empty), each
    ranking sorted by descending score, at most ``k`` hits, no duplicate documents. Time spent is
    added to ``timer`` under the names listed in ``stages``.
    """

    name: str
    stages: tuple[str, ...]

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run: ...
