"""Work done in a child process whose peak memory must not stay in this one: its ``retr`` log records come back
as records of this process's loggers (so they meet whatever handlers the application set up, the CLI's or a
library user's), not as text in the child's own format."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

logger = logging.getLogger(__name__)

_TAG = "retr-log\t"  # a relayed record's line on the child's stderr: tag, level, logger name, message


class _Relay(logging.Handler):
    """The child's side: each ``retr`` record as one tagged line on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = json.dumps(self.format(record))  # one line, whatever the message holds
            sys.stderr.write(f"{_TAG}{record.levelno}\t{record.name}\t{text}\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging must never fail the child's work
            self.handleError(record)


def relay_logs(level: int) -> None:
    """In a child process: send its ``retr`` records at ``level`` and above back to the parent (``run``)."""
    log = logging.getLogger("retr")
    log.setLevel(level)
    log.addHandler(_Relay())
    log.propagate = False


def run(code: str, args: list[str], refused: str = "refused: ") -> str | None:
    """Run ``code`` (Python source that calls ``relay_logs(int(sys.argv[1]))`` first) in a child process with
    this process's ``retr`` log level and ``args`` after it; its relayed records are logged here, any other
    line of its stderr passes through to this one's. The message of a line starting ``refused`` where the child
    exits 2 (a ``RetrError`` it met), else None; ``OSError`` where no child can be started, ``RuntimeError``
    where it fails otherwise."""
    argv = [sys.executable, "-c", code, str(logging.getLogger("retr").getEffectiveLevel()), *args]
    last = None
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as child:
        for line in child.stderr:
            if line.startswith(_TAG):
                _relayed(line)
            elif line.startswith(refused):
                last = line[len(refused):].strip()
            else:
                sys.stderr.write(line)
    if child.returncode == 2 and last:
        return last
    if child.returncode != 0:
        raise RuntimeError(f"the child process failed (exit {child.returncode})")
    return None


def _relayed(line: str) -> None:
    try:
        level, name, raw = line[len(_TAG):].rstrip("\n").split("\t", 2)
        levelno, text = int(level), json.loads(raw)
    except ValueError:
        sys.stderr.write(line)
        return
    logging.getLogger(name if name.startswith("retr") else "retr").log(levelno, "%s", text)


__all__ = ["relay_logs", "run"]
