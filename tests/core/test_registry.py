"""Backend discovery: pluggy validation, isolation, selection, allowlist, installed plugins."""

import importlib.metadata
import json
import os
import subprocess
import sys
import types

import attrs
import pytest
from support.plugins import plugin_module as plugin

from genlm.core import BackendNotFoundError, BackendUnavailableError, load_model_by_name
from genlm.core.backend import (
    PLUGIN_API,
    BackendSpec,
    Registry,
    backend_hook,
)
from genlm.core.cli import Command, command_hook
from genlm.core.hookspecs import hookimpl
from genlm.core.mock import MockLM

#: The nox sessions install the plugin fixtures and set this, so their tests never skip there.
REQUIRE_PLUGINS = os.environ.get("GENLM_REQUIRE_TEST_PLUGINS") == "1"


def spec(name, priority=0, probe=None, auto_select=True):
    return BackendSpec(
        name=name,
        loader="genlm.core.mock:MockLM.from_name",
        distribution=f"genlm-backend-{name}",
        plugin_api=1,
        probe=probe,
        priority=priority,
        auto_select=auto_select,
    )


def registry(*modules):
    reg = Registry()
    reg.register_plugins([(m.__name__, f"dist-{m.__name__}", m) for m in modules])
    return reg


def never_available():
    return "needs a CUDA GPU"


class TestSelection:
    def test_auto_selection_prefers_the_highest_priority_available(self):
        """backend=None skips unavailable and non-auto backends, then takes the best priority."""
        reg = registry(
            plugin(
                "p",
                spec("low", 1),
                spec("mid", 5),
                spec("gpu", 9, probe=never_available),
                spec("manual", 99, auto_select=False),
            )
        )
        assert reg.select().name == "mid"
        assert reg.select("low").name == "low"
        assert reg.select(among={"low", "gpu", "manual"}).name == "low"
        with pytest.raises(BackendNotFoundError, match="gpu: needs a CUDA GPU"):
            reg.select(among={"gpu", "manual"})

    def test_a_backend_is_auto_selected_only_when_its_spec_says_so(self):
        """auto_select defaults to False: a plugin that leaves it out (a toy backend)
        never takes over the calls that name no backend."""
        quiet = BackendSpec(
            name="toy", loader="genlm.core.mock:MockLM.from_name", distribution="d", plugin_api=1
        )
        assert quiet.auto_select is False
        reg = registry(plugin("p", quiet, spec("real", 1)))
        assert reg.select().name == "real"
        assert reg.select("toy").name == "toy"

    def test_unknown_backend_names_installed_ones_and_pip_hint(self):
        """An unknown backend's error lists what is installed and what to pip install."""
        reg = registry(plugin("p", spec("alpha"), spec("beta")))
        with pytest.raises(BackendNotFoundError) as info:
            reg.select("vllm")
        message = str(info.value)
        assert "alpha, beta" in message and "pip install genlm-backend-vllm" in message
        assert isinstance(info.value, ValueError)

    def test_unavailable_backend_says_why(self):
        """Asking for an installed backend that cannot run here names the reason."""
        reg = registry(plugin("p", spec("gpu", probe=never_available)))
        with pytest.raises(BackendUnavailableError, match="needs a CUDA GPU"):
            reg.select("gpu")
        with pytest.raises(BackendNotFoundError, match="gpu: needs a CUDA GPU"):
            reg.select()

    def test_loader_receives_name_and_options(self):
        """The chosen backend's loader is imported lazily and called with the options."""
        reg = registry(plugin("p", spec("m")))
        lm = reg.select("m").load("stories260K", max_batch_size=3)
        assert isinstance(lm, MockLM) and lm.batcher.max_batch_size == 3 and len(lm.vocab) == 512
        lm.close()


class TestIsolation:
    def test_raising_plugin_is_recorded_and_others_work(self):
        """A plugin whose hook raises is reported; other plugins still register."""
        reg = registry(plugin("bad", raises=RuntimeError("boom")), plugin("good", spec("g")))
        assert list(reg.backends) == ["g"]
        [error] = reg.errors
        assert error.plugin == "bad" and error.distribution == "dist-bad" and "boom" in str(error)
        assert isinstance(error, ImportError)

    def test_invalid_hook_signature_is_rejected_at_registration(self):
        """pluggy validation rejects a hook whose arguments are not in the spec."""
        module = types.ModuleType("wrong")

        @hookimpl
        def genlm_register_backends(registrar):
            pass

        module.genlm_register_backends = genlm_register_backends
        reg = registry(module, plugin("good", spec("g")))
        assert list(reg.backends) == ["g"]
        assert "registrar" in str(reg.errors[0])

    def test_name_collision_goes_to_the_owner_in_either_order(self):
        """Two plugins claiming one backend name: its owner keeps it, the other is reported."""
        other = BackendSpec(
            name="x", loader="a.b:c", distribution="genlm-backend-other", plugin_api=1
        )
        owner = ("first", "genlm-backend-x", plugin("first", spec("x")))
        intruder = ("second", "genlm-backend-other", plugin("second", other))
        for order in ([owner, intruder], [intruder, owner]):
            reg = Registry()
            reg.register_plugins(order)
            assert reg.backends["x"].distribution == "genlm-backend-x"
            [error] = reg.errors
            assert error.plugin == "second" and "belongs to genlm-backend-x" in str(error)

    def test_spec_validates_names(self):
        """A malformed backend name or loader path is rejected when the spec is made."""
        with pytest.raises(ValueError, match="backend name"):
            BackendSpec(name="Bad Name", loader="a:b", distribution="d", plugin_api=1)
        with pytest.raises(ValueError, match="loader"):
            BackendSpec(name="ok", loader="no-colon", distribution="d", plugin_api=1)


class TestPluginAPI:
    def test_spec_for_another_api_is_rejected_with_the_fix(self):
        """A spec built for an older or newer API is not registered; its line names the fix."""
        old = BackendSpec(
            name="old", loader="a.b:c", distribution="genlm-backend-old", plugin_api=1
        )
        new = attrs.evolve(old, name="new", distribution="genlm-backend-new", plugin_api=2)
        reg = Registry()
        reg.register_plugins(
            [
                ("old", "genlm-backend-old", plugin("old", old)),
                ("new", "genlm-backend-new", plugin("new", new)),
                ("good", "genlm-backend-good", plugin("good", spec("good"))),
            ]
        )
        assert sorted(reg.backends) == ["good", "old"]
        [error] = reg.errors
        assert reg.incompatible == {"new": error} and error.plugin == "new"
        message = str(error)
        assert "\n" not in message
        assert "plugin API 2" in message and f"serves plugin API {PLUGIN_API}" in message
        assert message.endswith("to fix: pip install --upgrade genlm-core")

    def test_spec_for_an_older_api_asks_to_upgrade_the_plugin(self, monkeypatch):
        """When core is the newer side, the fix upgrades the plugin's distribution."""
        monkeypatch.setattr("genlm.core._plugin_api.PLUGIN_API", 3)
        reg = registry(plugin("p", spec("legacy")))
        [error] = reg.errors
        assert "built for plugin API 1" in str(error) and "serves plugin API 3" in str(error)
        assert str(error).endswith("pip install --upgrade dist-p")

    def test_an_incompatible_owner_still_holds_its_name(self):
        """The owner of a name built for another API: no other plugin takes the name over
        (it was served, silently); asking for it raises the owner's line, and the
        intruder's claim is reported."""
        owner = BackendSpec(name="x", loader="a.b:c", distribution="genlm-backend-x", plugin_api=2)
        other = attrs.evolve(owner, distribution="genlm-backend-other", plugin_api=PLUGIN_API)
        for order in ((0, 1), (1, 0)):
            plugins = [
                ("x", "genlm-backend-x", plugin("x", owner)),
                ("other", "genlm-backend-other", plugin("other", other)),
            ]
            reg = Registry()
            reg.register_plugins([plugins[i] for i in order])
            assert "x" not in reg.backends
            with pytest.raises(BackendUnavailableError, match="built for plugin API 2"):
                reg.select("x")
            lines = sorted(str(e) for e in reg.errors)
            assert len(lines) == 2 and "belongs to genlm-backend-x" in lines[0]
            assert "'other'" in lines[0] and "plugin API 2" in lines[1]

    def test_loading_an_incompatible_backend_raises_its_line(self):
        """Asking for the rejected backend raises the same one line; auto-selection lists it."""
        new = BackendSpec(
            name="new", loader="a.b:c", distribution="genlm-backend-new", plugin_api=2
        )
        reg = registry(plugin("new", new))
        with pytest.raises(BackendUnavailableError) as info:
            reg.load_model("m", backend="new")
        assert str(info.value) == str(reg.incompatible["new"])
        with pytest.raises(BackendNotFoundError, match="built for plugin API 2"):
            reg.load_model("m")

    def test_spec_rejects_a_malformed_api_version(self):
        """plugin_api is a positive int, and required."""
        for bad in (0, "1", 1.0, True):
            with pytest.raises(ValueError, match="plugin_api"):
                BackendSpec(name="ok", loader="a:b", distribution="d", plugin_api=bad)
        with pytest.raises(TypeError, match="plugin_api"):
            BackendSpec(name="ok", loader="a:b", distribution="d")


installed = pytest.mark.skipif(
    not REQUIRE_PLUGINS
    and not any(
        d.metadata["Name"] == "genlm-backend-example" for d in importlib.metadata.distributions()
    ),
    reason="tests/plugins/* are not pip-installed (the nox sessions install them)",
)


def discover_in_subprocess(env_allowlist=None):
    """Run discovery in a fresh interpreter; return its backends, errors and heavy modules."""
    code = (
        "import json, sys\n"
        "from genlm.core.backend import Registry\n"
        "r = Registry.discover()\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', "
        "'vllm', 'mlx', 'mlx_lm'})\n"
        "print(json.dumps({'backends': sorted(r.backends), 'errors': [[e.plugin, "
        "e.distribution, str(e)] for e in r.errors], 'heavy': heavy}))\n"
    )
    env = dict(os.environ)
    env.pop("GENLM_BACKENDS", None)
    if env_allowlist is not None:
        env["GENLM_BACKENDS"] = env_allowlist
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout)


@installed
class TestInstalledPlugins:
    def test_third_party_plugin_is_found_through_installed_metadata(self):
        """The pip-installed example distribution's backend is discovered and loads."""
        found = discover_in_subprocess()
        assert {"example", "mock"} <= set(found["backends"])
        lm = load_model_by_name("7", backend="example")
        assert type(lm).__module__ == "genlm_backend_example.model"
        lm.close()

    def test_broken_plugin_is_isolated_and_reported(self):
        """The broken distribution is reported with its import error; the rest still load."""
        found = discover_in_subprocess()
        [broken] = [e for e in found["errors"] if e[0] == "broken"]
        assert broken[1] == "genlm-backend-broken"
        assert "genlm_dependency_that_is_not_installed" in broken[2]
        assert "example" in found["backends"]

    def test_discovery_imports_no_heavy_library(self):
        """Discovering every installed plugin imports no torch, transformers, vllm or mlx."""
        assert discover_in_subprocess()["heavy"] == []

    def test_allowlist_restricts_loading(self):
        """GENLM_BACKENDS loads only the named plugins (the broken one is not even imported)."""
        found = discover_in_subprocess("example")
        assert found["backends"] == ["example"] and found["errors"] == []
        found = discover_in_subprocess("mock, broken")
        assert found["backends"] == ["mock"] and [e[0] for e in found["errors"]] == ["broken"]


def installed_distribution(name):
    """Whether a pip distribution is installed; never false where the nox sessions require it."""
    return REQUIRE_PLUGINS or any(
        d.metadata["Name"] == name for d in importlib.metadata.distributions()
    )


@pytest.mark.skipif(
    not installed_distribution("genlm-backend-future"),
    reason="tests/plugins/genlm-backend-future is not pip-installed (the nox sessions install it)",
)
class TestInstalledFuturePlugin:
    def test_future_api_plugin_is_not_loaded_and_reported(self):
        """The installed plugin built for plugin API 2 is reported, not registered."""
        found = discover_in_subprocess()
        assert "future" not in found["backends"] and "example" in found["backends"]
        [error] = [e for e in found["errors"] if e[0] == "future"]
        core = importlib.metadata.version("genlm-core")
        assert error[1:] == [
            "genlm-backend-future",
            "plugin 'future' (genlm-backend-future): backend 'future' built for plugin API 2, "
            f"but genlm-core {core} serves plugin API {PLUGIN_API}; not loaded; "
            "to fix: pip install --upgrade genlm-core",
        ]

    def test_genlm_backends_and_load_model_by_name_report_it_in_one_line(self):
        """`genlm backends` prints the plugin's one line; loading it raises that line."""
        out = subprocess.run(
            [sys.executable, "-m", "genlm.core.cli", "backends"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        [line] = [x for x in out.splitlines() if "future" in x]
        assert line.startswith("incompatible plugin 'future' (genlm-backend-future)")
        assert "plugin API 2" in line and line.endswith("pip install --upgrade genlm-core")
        with pytest.raises(BackendUnavailableError) as info:
            load_model_by_name("7", backend="future")
        assert line == f"incompatible {info.value}"


# backend_hook and command_hook: a plugin's hook made from its specs, as pluggy sees it.


def test_backend_hook_registers_each_spec_through_pluggy():
    """The hook passes pluggy's validation and registers every spec it was given, in order."""
    made, other = spec("made"), spec("other")
    hook = backend_hook(made, lambda: other)
    registered: list[BackendSpec] = []
    hook(registered.append)
    assert registered == [made, other]
    module = types.ModuleType("made")
    module.genlm_register_backends = backend_hook(made)
    reg = registry(module)
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
    module = types.ModuleType("made")
    module.genlm_register_commands = command_hook(command)
    reg = registry(module)
    assert reg.errors == [] and reg.commands == {"made": command}


def test_anything_else_is_refused_when_the_hook_is_made():
    with pytest.raises(TypeError, match="genlm_register_backends takes BackendSpecs"):
        backend_hook("hf")


class TestPluginFaults:
    """What a plugin gets wrong breaks only that plugin, and is reported."""

    @staticmethod
    def hook_registering(make):
        """A plugin module whose hand-written hook registers what ``make()`` returns."""
        module = types.ModuleType("faulty")

        @hookimpl
        def genlm_register_backends(register):
            register(make())

        module.genlm_register_backends = genlm_register_backends
        return module

    @pytest.mark.parametrize(
        ("fields", "says"),
        [
            ({"priority": None}, "priority must be an int"),
            ({"priority": True}, "priority must be an int"),
            ({"probe": [never_available]}, "probe must be callable"),
            ({"probe": "not a path"}, "probe 'not a path' must look like"),
            ({"auto_select": "yes"}, "auto_select"),
            ({"description": None}, "description"),
        ],
    )
    def test_a_spec_with_a_bad_field_is_refused_when_made(self, fields, says):
        """Each field is checked when the spec is made (an unhashable probe or a None
        priority used to break discovery or auto-selection for every backend)."""
        with pytest.raises((TypeError, ValueError), match=says):
            attrs.evolve(spec("x"), **fields)

    def test_an_unhashable_probe_is_refused_and_the_rest_work(self):
        """A callable probe that cannot be hashed is the plugin's error, reported once."""

        @attrs.define
        class Probe:  # attrs' eq makes instances unhashable
            def __call__(self):
                return None

        reg = registry(
            self.hook_registering(lambda: attrs.evolve(spec("odd"), probe=Probe())),
            plugin("good", spec("g")),
        )
        assert list(reg.backends) == ["g"] and reg.select().name == "g"
        [error] = reg.errors
        assert error.plugin == "faulty" and "hashable" in str(error)

    def test_a_hook_registering_something_else_than_a_command_is_reported(self):
        module = types.ModuleType("faulty")

        @hookimpl
        def genlm_register_commands(register):
            register("not a command")

        module.genlm_register_commands = genlm_register_commands
        good = Command(name="good", help="h", configure=lambda parser: None, run=lambda a: 0)
        other = types.ModuleType("other")
        other.genlm_register_commands = command_hook(good)
        reg = registry(module, other)
        assert reg.commands == {"good": good}
        [error] = reg.errors
        assert error.plugin == "faulty" and "takes a Command, got str" in str(error)

    def test_a_command_named_like_a_core_command_is_reported(self):
        module = types.ModuleType("faulty")
        module.genlm_register_commands = command_hook(
            Command(name="smc", help="h", configure=lambda parser: None, run=lambda a: 0)
        )
        reg = registry(module)
        assert reg.commands == {}
        [error] = reg.errors
        assert "command 'smc' is genlm-core's own" in str(error)

    @staticmethod
    def unmarked_plugin():
        """A plugin module whose hook lacks pluggy's marker: pluggy never calls it."""
        module = types.ModuleType("genlm_backend_foo.plugin")

        def genlm_register_backends(register):
            register(spec("foo"))

        module.genlm_register_backends = genlm_register_backends
        return module

    @pytest.mark.parametrize("entry_point", ["foo", "foo-plugin"])
    def test_a_plugin_whose_hook_lacks_the_marker_is_reported(
        self, entry_point, monkeypatch, capsys
    ):
        """A plugin registering nothing because its hook is not marked is a broken plugin,
        listed by `genlm backends`; asking for its backend says it is installed, by entry
        point name or by the distribution owning the name (it was silent, and the error
        said to pip install genlm-backend-foo)."""
        from genlm.core import _registry
        from genlm.core.cli import main

        reg = Registry()
        reg.register_plugins(
            [
                (entry_point, "genlm-backend-foo", self.unmarked_plugin()),
                ("good", "dist-good", plugin("good", spec("g"))),
            ]
        )
        assert list(reg.backends) == ["g"]
        [error] = reg.errors
        assert error.plugin == entry_point and error.distribution == "genlm-backend-foo"
        assert "it registered no backend or command" in str(error)
        assert "genlm_register_backends is not marked with genlm.core.hookspecs.hookimpl" in (
            str(error)
        )
        with pytest.raises(BackendNotFoundError) as info:
            reg.select("foo")
        message = str(info.value)
        assert "installed but its plugin failed to load" in message, message
        assert "pip install" not in message
        monkeypatch.setattr(_registry, "_registry", reg)
        assert main(["backends"]) == 0
        out = capsys.readouterr().out
        assert f"broken plugin {entry_point} (genlm-backend-foo)" in out
        assert "it registered no backend or command" in out

    def test_a_plugin_whose_hooks_register_nothing_is_reported(self):
        """A marked hook that never calls register, or a module with no hook at all, is
        reported as broken, saying which."""
        empty = plugin("empty")
        bare = types.ModuleType("bare")
        reg = registry(empty, bare, plugin("good", spec("g")))
        assert list(reg.backends) == ["g"]
        assert [(e.plugin, str(e).split(": ", 1)[1]) for e in reg.errors] == [
            (
                "empty",
                "it registered no backend or command: its genlm_register_backends "
                "never called register",
            ),
            (
                "bare",
                "it registered no backend or command: it implements neither "
                "genlm_register_backends nor genlm_register_commands (a plugin written for "
                "a newer genlm-core may implement only hooks this one does not have: "
                "upgrade genlm-core)",
            ),
        ]

    def test_one_module_under_both_entry_point_groups_registers_once(self):
        """A plugin module listed as a backend plugin and a command plugin is one plugin:
        its hooks run once, nothing is reported (pluggy refused the second name)."""
        command = Command(name="odd-cmd", help="h", configure=lambda p: None, run=lambda a: 0)
        module = types.ModuleType("odd")
        module.genlm_register_backends = backend_hook(spec("odd"))
        module.genlm_register_commands = command_hook(command)
        reg = Registry()
        reg.register_plugins([("odd", "dist-odd", module), ("odd-cli", "dist-odd", module)])
        assert reg.errors == []
        assert list(reg.backends) == ["odd"] and reg.commands == {"odd-cmd": command}
        assert reg.plugins == [("odd", "dist-odd"), ("odd-cli", "dist-odd")]
