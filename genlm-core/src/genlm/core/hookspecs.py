"""The hooks a GenLM plugin implements. Markers and contracts only.

A plugin is a module named by an entry point in the group ``genlm.backends`` (a
backend) or ``genlm.plugins`` (anything else, e.g. CLI commands). It must be cheap to
import: heavy libraries (torch, vllm, mlx) are imported by the loader, on load.

Core imports every plugin module once per discovery (``genlm.core.backend.get_registry()``, the
first ``load_model_by_name`` or any ``genlm`` command), registers it with pluggy, which
checks each hook's arguments against the specs below, then calls each plugin's hooks on
their own. Whatever a plugin raises there, ``SystemExit`` included, is reported in
``registry.errors`` and ``genlm backends``; the other plugins are unaffected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from genlm.core._backend_spec import BackendSpec
    from genlm.core._command import Command

__all__ = [
    "PROJECT",
    "genlm_register_backends",
    "genlm_register_commands",
    "hookimpl",
    "hookspec",
]

PROJECT = "genlm"
"""The pluggy project name shared by the markers and core's plugin manager."""

hookspec = pluggy.HookspecMarker(PROJECT)
"""Marks the hook specifications below (core's side of the contract)."""

hookimpl = pluggy.HookimplMarker(PROJECT)
"""Decorate a plugin's hook functions with ``@hookimpl`` so pluggy finds them."""


@hookspec
def genlm_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Declare the backends this plugin provides.

    Called once per discovery, right after the plugin module is imported and validated,
    before any model is loaded. Call ``register(BackendSpec(...))`` once per backend
    (:class:`~genlm.core.backend.BackendSpec` only: anything else raises ``TypeError``);
    :func:`~genlm.core.backend.backend_hook` writes this implementation from the specs.

    A plugin may: register any number of backends, decide a spec's fields from cheap
    facts (``auto_select=cuda_gpu_present()``, say). A plugin whose hooks register
    nothing at all (no backend, no command) is reported as broken: register a backend
    that cannot run here anyway, with a ``probe`` saying why, and mark a hand-written hook
    with :data:`hookimpl`, without which pluggy never calls it. It must not: import heavy libraries
    or load a model (the spec's ``loader`` does that, on demand), keep or call
    ``register`` after returning, rely on the order plugins are called in, or register one
    name twice with different specs (neither is used: choose the fields in one spec). Core owns
    naming and collisions: a name belongs to the distribution ``genlm-backend-NAME``
    (``mock`` to genlm-core); another distribution's claim on it is reported and ignored.
    A hook that raises is reported as a broken plugin; its other backends may be lost.
    """


@hookspec
def genlm_register_commands(register: Callable[[Command], None]) -> None:
    """Declare the ``genlm`` CLI subcommands this plugin adds.

    Called once per discovery, like :func:`genlm_register_backends`; the ``genlm`` script
    discovers plugins before parsing its arguments. Call ``register(Command(...))`` per
    subcommand (a ``genlm.core.cli.Command``; ``genlm.core.cli.command_hook`` writes this
    implementation from the commands). The command's ``configure`` is called each time
    the ``genlm`` script builds its parser, whichever command the user runs, and ``run``
    only when the user runs this one, so import heavy modules inside ``run``, not here.
    A ``configure`` that raises, ``SystemExit`` included, is reported and breaks only its
    command; ``help`` is plain text (a ``%`` is shown as it is). A command name that core
    (``backends``, ``smc``) or an earlier plugin already uses is reported and ignored.
    """
