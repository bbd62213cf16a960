"""GenLM's vLLM backend: ``VLLMLM`` on the V1 engine (imported lazily: vllm is heavy)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # static tools (type checkers, the API reference) see the lazy name
    from genlm.backends.vllm._model import VLLMLM

__all__ = ["VLLMLM"]


def __getattr__(name: str) -> Any:
    if name == "VLLMLM":
        from genlm.backends.vllm._model import VLLMLM

        return VLLMLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
