"""Models shipped inside genlm-core, resolvable by name without any download."""

from __future__ import annotations

from pathlib import Path

EMBEDDED_DIR = Path(__file__).parent / "models"
"""The folder holding the embedded models (package data)."""

EMBEDDED_MODELS = {"stories260K": EMBEDDED_DIR / "stories260K"}
"""Name -> directory of the models bundled as package data."""

DEFAULT_MODEL = "stories260K"
"""What the CLI uses when no model is named: the embedded 260K-parameter TinyStories
llama2 model (512-token vocabulary), so everything runs offline."""


def resolve_model_path(name: str) -> str:
    """The local directory of an embedded model, else ``name`` (a hub id or path) unchanged.

    Backends pass every model name through this, so ``"stories260K"`` loads offline.
    """
    path = EMBEDDED_MODELS.get(name)
    return str(path) if path is not None else name
