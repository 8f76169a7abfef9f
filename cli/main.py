"""The `retr` command line: one module per subcommand (its options and its ``run``), each importing its work
lazily; option defaults and choices come from the configs they fill.

``main(argv)`` returns the exit code, so tests call it in-process.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence

logger = logging.getLogger("retr")


def version() -> str:
    """The installed distribution's version; from a source tree that is not installed, its pyproject.toml's."""
    from importlib import metadata

    try:
        return metadata.version("retr")
    except metadata.PackageNotFoundError:
        import tomllib
        from pathlib import Path

        try:
            with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
                return str(tomllib.load(f)["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


def build_parser() -> argparse.ArgumentParser:
    from retr.cli import (
        check_reranker,
        compare,
        doctor,
        index,
        regress,
        report,
        search,
        serve,
        surface,
        train,
        update,
    )
    from retr.cli import eval as eval_cmd

    parser = argparse.ArgumentParser(prog="retr", description="Build, search and measure retrieval pipelines.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    parser.add_argument("--version", action="version", version=f"retr {version()}",
                        help="print retr's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    for command in (index, update, search, eval_cmd, check_reranker, compare, report, regress, train, serve, doctor):
        command.add_parser(sub)
    return surface.finish(parser)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (so in-process callers can redirect it), never into the sink of a
    block that keeps third-party output off the terminal (``quiet.terminal_stderr``)."""

    @property
    def stream(self):  # type: ignore[override]
        from retr.retrieval.backends.quiet import terminal_stderr

        return terminal_stderr()

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _setup_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[retr] %(levelname)s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
    # the CLI is the application: keep third-party chatter (weight-loading bars, info logs) off stderr,
    # without importing those libraries before they are needed
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is: the work unwinds as on Ctrl-C (half-built folders removed)."""


def _on_sigterm(_signum, _frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Within: SIGTERM handled like Ctrl-C, where nothing else handles it (its default action ends the process
    before any cleanup) and this is the main thread (only it may set handlers); the handler restored after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args)
    from retr.retrieval.errors import RetrError

    try:
        with _sigterm_as_interrupt():
            return args.run(args)
    except RetrError as e:
        print(f"retr: error: {e}", file=sys.stderr)
        return 2
    except Terminated:
        print("retr: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("retr: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
