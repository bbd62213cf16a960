"""Registers the ``mock`` backend, through the same entry point door as every backend."""

from __future__ import annotations

from genlm.core._backend_spec import BackendSpec
from genlm.core._plugin_hooks import backend_hook

genlm_register_backends = backend_hook(
    BackendSpec(
        name="mock",
        loader="genlm.core.mock:MockLM.from_name",
        distribution="genlm-core",
        plugin_api=1,
        priority=-100,
        auto_select=False,
        description="deterministic fake model over any tokenizer's vocabulary (for tests)",
    )
)
