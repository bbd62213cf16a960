"""What commands taking a text prompt share: the check they make before loading a model,
and reading the prompt's own tokens."""

from __future__ import annotations

import os
from typing import Any

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


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """The token ids of ``text`` without the special tokens a transformers tokenizer adds
    (BOS): ``encode(text, add_special_tokens=False)``, or, for a tokenizer whose ``encode``
    takes the text alone (tiktoken, any ``encode(text) -> list[int]``, as backends
    document), ``encode(text)``, which adds none. A ``tokenizers.Tokenizer``'s
    ``Encoding`` gives its ``ids``.

    Raises:
        TypeError: what the tokenizer's ``encode`` raised, unless it was refusing the
            ``add_special_tokens`` keyword.
    """
    try:
        encoded = tokenizer.encode(text, add_special_tokens=False)
    except TypeError as exc:
        if "add_special_tokens" not in str(exc):
            raise
        encoded = tokenizer.encode(text)
    return list(getattr(encoded, "ids", encoded))
