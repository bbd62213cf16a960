"""GenLM's vLLM backend: ``VLLMLM`` on the V1 engine (imported lazily: vllm is heavy)."""

from __future__ import annotations

from typing import Any

__all__ = ["VLLMLM"]


def __getattr__(name: str) -> Any:
    if name == "VLLMLM":
        from genlm.backends.vllm._model import VLLMLM

        return VLLMLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
