"""The check every command taking a text prompt makes before it loads a model."""

from __future__ import annotations

import os

from genlm.core.cli._errors import CLIError


def check_prompt(prompt: str) -> None:
    """Refuse a prompt that is not valid UTF-8 text, naming its bytes, before any model loads.

    A command-line argument holding bytes the locale cannot decode (``$'caf\\xe9'``)
    reaches Python with surrogates in it; a tokenizer would fail on it only once the
    model has loaded, with a message that does not name the prompt.

    Raises:
        CLIError: the prompt holds a surrogate (the message shows its raw bytes).
    """
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CLIError(f"the prompt is not valid UTF-8 text: {os.fsencode(prompt)!r}") from exc
