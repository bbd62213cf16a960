"""The hooks a GenLM plugin implements. Markers and contracts only.

A plugin is a module named by an entry point in the group ``genlm.backends`` (a
backend) or ``genlm.plugins`` (anything else, e.g. CLI commands). It must be cheap to
import: heavy libraries (torch, vllm, mlx) are imported by the loader, on load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from genlm.core._backend_spec import BackendSpec
    from genlm.core._command import Command

PROJECT = "genlm"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def genlm_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Call ``register(BackendSpec(...))`` once for each backend the plugin provides.

    Core owns naming, collisions, lazy loading and isolation: a plugin that raises
    here is reported and skipped, the others keep working.
    """


@hookspec
def genlm_register_commands(register: Callable[[Command], None]) -> None:
    """Call ``register(Command(...))`` for each ``genlm`` CLI command the plugin adds."""
