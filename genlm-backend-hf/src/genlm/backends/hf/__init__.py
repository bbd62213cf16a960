"""GenLM's Hugging Face transformers backend: ``HFLM``.

``HFLM`` is imported lazily, so importing this package (as the plugin does) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genlm.backends.hf._model import HFLM

__all__ = ["HFLM"]


def __getattr__(name: str) -> Any:
    if name == "HFLM":
        from genlm.backends.hf._model import HFLM

        return HFLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
