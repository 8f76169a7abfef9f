"""The one exception type retr raises for bad input: its message is a single line for the user."""

from __future__ import annotations


class RetrError(Exception):
    """A user-facing error: the CLI prints ``retr: <message>`` and exits non-zero.

    Messages name the file (and line) at fault and, where possible, say how to fix it.
    """

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
