"""GenLM's Apple MLX backend: ``MLXLM`` over any mlx-lm model.

Importing this package does not import MLX; ``MLXLM`` is loaded on first access, so the
plugin module stays cheap for backend discovery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from genlm.core.backend import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from genlm.backends.mlx._model import MLXLM

__all__ = ["MLXLM"]

__getattr__, __dir__ = _lazy_exports(__name__, "genlm-backend-mlx", {"MLXLM": "_model"})
