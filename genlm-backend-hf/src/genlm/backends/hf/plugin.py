"""Registers the ``hf`` backend. Cheap to import: no torch or transformers import here."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from genlm.core.backend import BackendSpec
from genlm.core.hookspecs import hookimpl


@hookimpl
def genlm_register_backends(register: Callable[[BackendSpec], None]) -> None:
    register(
        BackendSpec(
            name="hf",
            loader="genlm.backends.hf._model:HFLM.from_name",
            distribution="genlm-backend-hf",
            plugin_api=1,
            probe="genlm.backends.hf.plugin:unavailable_reason",
            priority=10,
            description="Hugging Face transformers (CPU or CUDA) with automatic KV reuse and LoRA",
        )
    )


def unavailable_reason() -> str | None:
    """Why the backend cannot run here, or None; looks for the packages without importing them."""
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        return f"missing {' and '.join(missing)}: pip install genlm-backend-hf"
    return None
