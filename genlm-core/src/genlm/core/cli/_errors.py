"""The CLI's one-line errors, in their own module so every command module can import them
without importing the ``genlm.core.cli`` package that imports those modules."""

from __future__ import annotations


class CLIError(Exception):
    """A failure the user can fix, reported as one line without a traceback."""


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (library messages often span several), or its
    class name when the message is empty (or cannot be shown: its ``__str__`` raised)."""
    try:
        text = " ".join(str(exc).split())
    except Exception:  # noqa: BLE001 - a plugin's exception that cannot show itself
        text = ""
    return text or type(exc).__name__
