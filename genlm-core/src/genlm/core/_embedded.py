"""Models shipped inside genlm-core, resolvable by name without any download."""

from __future__ import annotations

import os
from pathlib import Path

EMBEDDED_DIR = Path(__file__).parent / "models"
"""The folder holding the embedded models (package data)."""

EMBEDDED_MODELS = {"stories260K": EMBEDDED_DIR / "stories260K"}
"""Name -> directory of the models bundled as package data."""

DEFAULT_MODEL = "stories260K"
"""What the CLI uses when no model is named: the embedded 260K-parameter TinyStories
llama2 model (512-token vocabulary), so everything runs offline."""


def is_local_path(name: str) -> bool:
    """Whether ``name`` can only be a path on this machine, never a hub id.

    Hub ids are ``NAME`` or ``OWNER/NAME``; a name starting with ``/``, ``.`` or ``~``,
    holding two ``/`` or more, or the platform's other separator is a path.
    """
    return (
        name.startswith(("/", ".", "~"))
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
    )


def resolve_model_path(name: str | os.PathLike) -> str:
    """The local directory of an embedded model; a local path with ``~`` expanded; else
    ``name`` (a hub id, or a path not written as one) unchanged. A path object
    (``pathlib.Path``) is always a local path.

    Backends pass every model name through this, so ``"stories260K"`` loads offline, and a
    mistyped local path fails here, naming it, instead of inside the loader, which would
    take it for a hub id (transformers: "Repo id must use alphanumeric chars", seconds
    later, or a retried download).

    Raises:
        FileNotFoundError: ``name`` can only be a local path (:func:`is_local_path`, or a
            path object) and nothing is there.
    """
    given_as_path = isinstance(name, os.PathLike)
    if given_as_path:  # a path object is a local path, whatever it looks like
        name = os.fsdecode(name)
    path = None if given_as_path else EMBEDDED_MODELS.get(name)
    if path is not None:
        return str(path)
    if isinstance(name, str) and (given_as_path or is_local_path(name)):
        local = os.path.expanduser(name)
        if not os.path.exists(local):
            raise FileNotFoundError(f"model path {name!r} does not exist")
        return local
    return name
