"""Third-party chatter during graph work routed to retr's log instead of the terminal: NNCF's rich progress
bars and INFO lines, and onnxruntime's quantiser advice, which it logs through the *root* logger (a bare
``logging.warning`` installs a handler on the root logger when it has none: afterwards every record of every
library was printed twice)."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator

logger = logging.getLogger(__name__)

_outer_stderr: list = []  # the stderr each open quiet block replaced, outermost first


def terminal_stderr():
    """The stderr retr's own log lines go to: the one a quiet block replaced while one is open (its sink takes
    third-party output only), else ``sys.stderr`` as it is now."""
    return _outer_stderr[0] if _outer_stderr else sys.stderr


def vendor_telemetry_off() -> None:
    """Keep OpenVINO's and NNCF's telemetry from ever starting in this process; call before importing either.
    ``import openvino`` imports ``openvino.tools.ovc``, which starts ``openvino_telemetry``: on a fresh HOME it
    writes ``~/intel/``, would send usage events, and logs through the *root* logger (a root handler appears and
    every retr line is printed twice). With ``openvino_telemetry`` unimportable, OpenVINO and NNCF take their own
    no-op stubs. A process that imported it itself before retr keeps it."""
    sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]


class _ToDebug(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.name == logger.name:  # its own line, propagated up to the root: handled once already
            return
        logger.debug("%s: %s", record.name, record.getMessage())


@contextlib.contextmanager
def quiet_third_party(*names: str) -> Iterator[None]:
    """Inside: the root logger and the loggers ``names`` hand their records to retr's debug log only, and
    what is printed to stdout/stderr (progress bars) is kept out of the terminal and logged at debug."""
    root = logging.getLogger()
    saved = [(root, root.handlers[:], root.level, root.propagate)]
    for name in names:
        lg = logging.getLogger(name)
        saved.append((lg, lg.handlers[:], lg.level, lg.propagate))
    to_debug = _ToDebug()
    root.handlers = [to_debug]
    for name in names:
        lg = logging.getLogger(name)
        lg.handlers, lg.propagate = [to_debug], False
        lg.setLevel(logging.INFO)
    sink = io.StringIO()
    _outer_stderr.append(sys.stderr)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield
    finally:
        _outer_stderr.pop()
        for lg, handlers, level, propagate in saved:
            lg.handlers, lg.propagate = handlers, propagate
            lg.setLevel(level)
        text = sink.getvalue().strip()
        if text:
            logger.debug("third-party output: %s", text[-2000:])
