"""Hook implementations made from data, so that a plugin module declares what it adds.

Every plugin's hook did the same thing: call ``register`` once per spec. Here that is
written once; ``backend_hook`` is public in :mod:`genlm.core.backend` and
``command_hook`` in :mod:`genlm.core.cli`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from genlm.core._backend_spec import BackendSpec
from genlm.core._command import Command
from genlm.core.hookspecs import hookimpl

T = TypeVar("T")


def _hook(
    hook_name: str, kind: type[T], declared: tuple[T | Callable[[], T], ...]
) -> Callable[[Callable[[T], None]], None]:
    """A pluggy implementation of ``hook_name`` that registers each of ``declared``."""
    for item in declared:
        if not isinstance(item, kind) and not callable(item):
            raise TypeError(
                f"{hook_name} takes {kind.__name__}s or callables returning one, "
                f"got {type(item).__name__}"
            )

    def hook(register: Callable[[T], None]) -> None:
        for item in declared:
            register(item if isinstance(item, kind) else item())

    hook.__name__ = hook.__qualname__ = hook_name
    return hookimpl(hook)


def backend_hook(
    *specs: BackendSpec | Callable[[], BackendSpec],
) -> Callable[[Callable[[BackendSpec], None]], None]:
    """The ``genlm_register_backends`` hook of a plugin registering ``specs``.

    Assign it in the plugin module: ``genlm_register_backends = backend_hook(BackendSpec(...))``.
    A spec whose fields depend on the machine (``auto_select=cuda_gpu_present()``) is given
    as a function returning it, called at each registration rather than at import.
    """
    return _hook("genlm_register_backends", BackendSpec, specs)


def command_hook(
    *commands: Command | Callable[[], Command],
) -> Callable[[Callable[[Command], None]], None]:
    """The ``genlm_register_commands`` hook of a plugin adding ``commands`` to the CLI.

    Assign it in the plugin module: ``genlm_register_commands = command_hook(Command(...))``.
    """
    return _hook("genlm_register_commands", Command, commands)
