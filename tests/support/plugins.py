"""In-memory backend plugins for registry tests: module objects, never written to disk."""

from __future__ import annotations

import types

from genlm.core.backend import BackendSpec
from genlm.core.hookspecs import hookimpl


def plugin_module(
    name: str, *specs: BackendSpec, raises: BaseException | None = None
) -> types.ModuleType:
    """A plugin module called ``name`` whose hook registers ``specs``, or raises ``raises``."""
    module = types.ModuleType(name)

    @hookimpl
    def genlm_register_backends(register):
        if raises is not None:
            raise raises
        for spec in specs:
            register(spec)

    module.genlm_register_backends = genlm_register_backends
    return module
