"""The preamble every reader of an exchanged IR file (topics, runs) opens with: the file checked, and its form
taken as given or detected from the file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from retr.retrieval.artifacts import not_a_file
from retr.retrieval.errors import RetrError


def file_and_form(path: str | Path, fmt: str | None, forms: tuple[str, ...], detect: Callable[[Path], str],
                  what: str) -> tuple[Path, str]:
    """``path`` (a ``RetrError`` where it is not a file: "no such ``what`` file") and its form: ``fmt``, which must
    be one of ``forms``, or where None the one ``detect(path)`` finds (which names the file and line it fails on)."""
    path = Path(path)
    if not path.is_file():
        kind = not_a_file(path)
        raise RetrError(f"{path}: {kind}, not a {what} file" if kind else f"{path}: no such {what} file")
    if fmt is None:
        return path, detect(path)
    if fmt not in forms:
        raise RetrError(f"{what} format {fmt!r}: choose one of {', '.join(forms)}")
    return path, fmt
