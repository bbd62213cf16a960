"""Registers the ``hf`` backend. Cheap to import: no torch or transformers import here."""

from __future__ import annotations

import importlib.util

from genlm.core.backend import BackendSpec, backend_hook

genlm_register_backends = backend_hook(
    BackendSpec(
        name="hf",
        loader="genlm.backends.hf._model:HFLM.from_name",
        distribution="genlm-backend-hf",
        plugin_api=1,
        probe="genlm.backends.hf.plugin:unavailable_reason",
        priority=10,
        auto_select=True,
        description="Hugging Face transformers (CPU or CUDA) with automatic KV reuse and LoRA",
    )
)


def unavailable_reason() -> str | None:
    """Why the backend cannot run here, or None; looks for the packages without importing them."""
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        return f"missing {' and '.join(missing)}: pip install genlm-backend-hf"
    return None
