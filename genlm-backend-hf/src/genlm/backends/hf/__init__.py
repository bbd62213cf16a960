"""GenLM's Hugging Face transformers backend: ``HFLM``.

``HFLM`` is imported lazily, so importing this package (as the plugin does) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from genlm.core.backend import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from genlm.backends.hf._model import HFLM

__all__ = ["HFLM"]

__getattr__, __dir__ = _lazy_exports(__name__, "genlm-backend-hf", {"HFLM": "_model"})
