"""GenLM's vLLM backend: ``VLLMLM`` on the V1 engine.

``VLLMLM`` is imported lazily (vllm is heavy), so importing this package (as the plugin
does) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from genlm.core.backend import lazy_exports as _lazy_exports

if TYPE_CHECKING:  # static tools (type checkers, the API reference) see the lazy name
    from genlm.backends.vllm._model import VLLMLM

__all__ = ["VLLMLM"]

__getattr__, __dir__ = _lazy_exports(__name__, "genlm-backend-vllm", {"VLLMLM": "_model"})
