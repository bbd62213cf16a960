"""GenLM's Apple MLX backend: ``MLXLM`` over any mlx-lm model.

Importing this package does not import MLX; ``MLXLM`` is loaded on first access, so the
plugin module stays cheap for backend discovery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genlm.backends.mlx._model import MLXLM

__all__ = ["MLXLM"]


def __getattr__(name: str) -> Any:
    if name == "MLXLM":
        from genlm.backends.mlx._model import MLXLM

        return MLXLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
