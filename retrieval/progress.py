"""How every long step reports itself (encoding, indexing on Ray, searching a batch of queries, evaluating,
training): on a terminal, a bar; elsewhere (a pipe, a log file, CI, a notebook's captured stderr), one log line
every ``RETR_PROGRESS_SECONDS`` seconds (default 30) with what is done of the total, the rate and the time left,
and one line when the step ends. The one place progress is made: nothing else in retr opens a bar.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

INTERVAL_ENV = "RETR_PROGRESS_SECONDS"
DEFAULT_INTERVAL = 30.0


def interval() -> float:
    """Seconds between two progress lines when stderr is not a terminal (``$RETR_PROGRESS_SECONDS``)."""
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise RetrError(f"{INTERVAL_ENV} must be a number of seconds >= 0, got {raw!r}")
    return value


def _terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour)."""
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """``total`` units of one step called ``what`` (``unit``: "doc", "q", "step"). ``update(n)`` as units finish;
    ``close()`` (or the ``with`` block's end) when it ends. ``show=False``: silent. ``bar``: None draws a bar on a
    terminal and logs lines elsewhere; True/False forces either. ``initial``: units done before (a resumed run);
    ``leave``: the bar stays on the terminal once closed."""

    def __init__(self, total: int, what: str, unit: str = "doc", show: bool = True, bar: bool | None = None,
                 initial: int = 0, leave: bool = False):
        self.total, self.what, self.unit = int(total), what, unit
        self.done = self._first = int(initial)
        self.postfix: dict[str, str] = {}
        self._show = show and total > 0
        self._t0 = self._last = time.perf_counter()
        self._every = interval()
        self._bar = None
        self._lines = 0
        if self._show and (_terminal() if bar is None else bar) and logger.isEnabledFor(logging.INFO):
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total, initial=self.done, desc=what, unit=unit, file=sys.stderr,
                             dynamic_ncols=True, leave=leave)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close(finished=exc[0] is None)

    @property
    def drawing(self) -> bool:
        """Whether a bar is drawn (on a terminal) rather than lines logged."""
        return self._bar is not None

    def set_postfix(self, **values: str) -> None:
        """Shown after the counts (the bar's postfix; the end of each line)."""
        self.postfix.update(values)
        if self._bar is not None:
            self._bar.set_postfix(self.postfix)

    def update(self, n: int = 1) -> None:
        self.done += int(n)
        if self._bar is not None:
            self._bar.update(int(n))
        elif self._show:
            now = time.perf_counter()
            if now - self._last >= self._every and self.done < self.total:
                self._last = now
                self._log(now)

    def line(self, now: float | None = None) -> str:
        """What a progress line says: done/total (percent), rate, elapsed and time left."""
        now = time.perf_counter() if now is None else now
        spent = now - self._t0
        rate = (self.done - self._first) / spent if spent > 0 else 0.0
        pct = 100.0 * self.done / self.total if self.total else 100.0
        text = f"{self.what}: {self.done:,}/{self.total:,} {self.unit}s ({pct:.0f}%), {rate:,.1f} {self.unit}s/s, "
        if self.done < self.total:
            left = (self.total - self.done) / rate if rate > 0 else float("nan")
            text += f"{clock(spent)} spent, ETA {clock(left) if left == left else '?'}"
        else:
            text += f"done in {clock(spent)}"
        if self.postfix:
            text += " (" + ", ".join(f"{k} {v}" for k, v in self.postfix.items()) + ")"
        return text

    def _log(self, now: float) -> None:
        self._lines += 1
        logger.info("%s", self.line(now))

    def close(self, finished: bool = True) -> None:
        """End the step: the bar closed; without a bar, a last line where a line was logged already (so that a
        step that logged its progress also says it ended)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._show and finished and self._lines:
            self._log(time.perf_counter())
        self._show = False
