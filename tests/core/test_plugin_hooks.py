"""backend_hook and command_hook: a plugin's hook made from its specs, as pluggy sees it."""

from __future__ import annotations

import types

import pytest

from genlm.core.backend import BackendSpec, Registry, backend_hook, type_checking_exports
from genlm.core.cli import Command, command_hook


def spec(name: str, auto_select: bool = False) -> BackendSpec:
    return BackendSpec(
        name=name,
        loader="genlm.core.mock:MockLM.from_name",
        distribution=f"genlm-backend-{name}",
        plugin_api=1,
        auto_select=auto_select,
    )


def registry_of(**hooks) -> Registry:
    module = types.ModuleType("made")
    for name, hook in hooks.items():
        setattr(module, name, hook)
    reg = Registry()
    reg.register_plugins([("made", "genlm-backend-made", module)])
    return reg


def test_backend_hook_registers_each_spec_through_pluggy():
    """The hook passes pluggy's validation and registers every spec it was given, in order."""
    made, other = spec("made"), spec("other")
    hook = backend_hook(made, lambda: other)
    registered: list[BackendSpec] = []
    hook(registered.append)
    assert registered == [made, other]
    reg = registry_of(genlm_register_backends=backend_hook(made))
    assert reg.errors == [] and reg.backends == {"made": made}


def test_a_spec_function_is_called_at_each_registration():
    """A function given for a spec decides its fields when the hook runs, not at import."""
    platform = {"gpu": False}
    hook = backend_hook(lambda: spec("made", auto_select=platform["gpu"]))
    registered: list[BackendSpec] = []
    hook(registered.append)
    platform["gpu"] = True
    hook(registered.append)
    assert [s.auto_select for s in registered] == [False, True]


def test_command_hook_adds_the_command():
    command = Command(name="made", help="h", configure=lambda parser: None, run=lambda args: 0)
    reg = registry_of(genlm_register_commands=command_hook(command))
    assert reg.errors == [] and reg.commands == {"made": command}


def test_anything_else_is_refused_when_the_hook_is_made():
    with pytest.raises(TypeError, match="genlm_register_backends takes BackendSpecs"):
        backend_hook("hf")


def test_type_checking_exports_reads_the_static_imports(tmp_path):
    """Names map to their modules, in order; a file without the block is refused."""
    source = tmp_path / "pkg.py"
    source.write_text(
        "from typing import TYPE_CHECKING as _TYPE_CHECKING\n"
        "import os\n"
        "if _TYPE_CHECKING:\n"
        "    from b.mod import Z as Z, y as y\n"
        "    from a import X as X\n"
    )
    assert list(type_checking_exports(str(source)).items()) == [
        ("Z", "b.mod"),
        ("y", "b.mod"),
        ("X", "a"),
    ]
    source.write_text("import os\n")
    with pytest.raises(ValueError, match="no top-level `if TYPE_CHECKING:`"):
        type_checking_exports(str(source))
