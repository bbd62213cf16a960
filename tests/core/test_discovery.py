"""Discovery through installed entry points, faked inline: precedence, availability, isolation.

Each test writes real plugin modules into a temporary directory on ``sys.path`` and
replaces ``importlib.metadata.entry_points`` with entry points naming them, so discovery
runs exactly as for installed distributions (as pluggy's own tests fake importlib.metadata).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import re
import sys
import textwrap
import uuid

import attrs
import pytest
from support.plugins import plugin_module

from genlm.core import BackendNotFoundError, BackendUnavailableError, _registry, load_model_by_name
from genlm.core._plugin_api import mismatch_hint
from genlm.core.backend import PLUGIN_API, BackendSpec, Registry
from genlm.core.cli import Command, main
from genlm.core.mock import MockLM

MOCK_LOADER = "genlm.core.mock:MockLM.from_name"


@attrs.frozen
class FakeDistribution:
    name: str


@attrs.frozen
class FakeEntryPoint:
    """What discovery reads from an ``importlib.metadata.EntryPoint``."""

    name: str
    value: str
    dist: FakeDistribution | None
    group: str = "genlm.backends"

    def load(self):
        module, _, attr = self.value.partition(":")
        obj = importlib.import_module(module)
        return getattr(obj, attr) if attr else obj


@pytest.fixture
def make_module(tmp_path, monkeypatch):
    """Write a module with a unique name onto sys.path; returns its import name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written = []

    def write(source: str) -> str:
        name = f"genlm_test_plugin_{uuid.uuid4().hex[:12]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def backend_plugin(make_module, name, distribution, description="", loader=MOCK_LOADER, **kw):
    """A plugin module registering one backend; returns its module name."""
    extra = "".join(f", {k}={v!r}" for k, v in kw.items())
    return make_module(
        f"""
        from genlm.core.backend import BackendSpec
        from genlm.core.hookspecs import hookimpl

        @hookimpl
        def genlm_register_backends(register):
            register(BackendSpec(name={name!r}, loader={loader!r},
                                 distribution={distribution!r},
                                 description={description!r}, plugin_api=1{extra}))
        """
    )


@pytest.fixture
def installed(monkeypatch):
    """Install fake entry points: ``installed([(ep name, module, dist name), ...])``."""

    def install(entries):
        eps = [FakeEntryPoint(n, v, FakeDistribution(d) if d else None) for n, v, d in entries]
        monkeypatch.setattr(
            importlib.metadata,
            "entry_points",
            lambda group: [ep for ep in eps if ep.group == group],
        )

    return install


@pytest.fixture
def process_registry(monkeypatch):
    """Let ``get_registry()`` rediscover in this test; forget it afterwards."""
    monkeypatch.setattr(_registry, "_registry", None)
    monkeypatch.delenv("GENLM_BACKENDS", raising=False)


class TestPrecedence:
    """Issue 12 item 15: the distribution a name belongs to wins, whatever the order."""

    @pytest.mark.parametrize("intruder_first", [True, False])
    def test_owner_wins_and_the_intruder_is_reported(self, make_module, installed, intruder_first):
        """genlm-backend-hf keeps `hf` against a third party also claiming it (same ep name)."""
        real = backend_plugin(make_module, "hf", "genlm-backend-hf", "real")
        # The intruder even declares itself as genlm-backend-hf: only installed metadata counts.
        fake = backend_plugin(make_module, "hf", "genlm-backend-hf", "intruder")
        entries = [("hf", fake, "genlm-fast-hf"), ("hf", real, "genlm-backend-hf")]
        installed(entries if intruder_first else entries[::-1])
        reg = Registry.discover()
        assert reg.backends["hf"].description == "real"
        [error] = reg.errors
        assert (error.plugin, error.distribution) == ("hf", "genlm-fast-hf")
        assert "belongs to genlm-backend-hf" in str(error)

    def test_core_owns_mock(self, make_module, installed):
        """A plugin registering `mock` from another distribution does not replace core's."""
        fake = backend_plugin(make_module, "mock", "genlm-backend-mock", "fake mock")
        installed(
            [("aaa", fake, "genlm-backend-mock"), ("mock", "genlm.core.mock_plugin", "genlm-core")]
        )
        reg = Registry.discover()
        assert reg.backends["mock"].distribution == "genlm-core"
        assert [e.distribution for e in reg.errors] == ["genlm-backend-mock"]

    @pytest.mark.parametrize("order", [0, 1])
    def test_claims_without_the_owner_give_the_name_to_nobody(self, make_module, installed, order):
        """Two third parties claim `foo`, neither is genlm-backend-foo: both reported, none
        used; asking for it says it is installed but served by nobody, and why."""
        a = backend_plugin(make_module, "foo", "x", "a")
        b = backend_plugin(make_module, "foo", "y", "b")
        entries = [("a", a, "genlm-a"), ("b", b, "genlm-b")]
        installed(entries if order == 0 else entries[::-1])
        reg = Registry.discover()
        assert "foo" not in reg.backends
        assert sorted(e.distribution for e in reg.errors) == ["genlm-a", "genlm-b"]
        with pytest.raises(BackendNotFoundError) as raised:
            reg.select("foo")
        message = str(raised.value)
        assert message.startswith("backend 'foo' is installed but not served: ")
        assert "backend name 'foo' is claimed 2 times (genlm-a, genlm-b)" in message
        assert "pip install" not in message

    @pytest.mark.parametrize("distribution", ["genlm-backend-bar", "acme-bar"])
    def test_a_plugin_registering_a_name_twice_is_told_so(self, distribution):
        """One plugin registering `bar` twice with different specs (say cpu and gpu), as
        its owner or not, gets one line saying so, not advice to uninstall all but one of
        its own claims; the name goes to nobody."""
        reg = Registry()
        reg.register_plugins(
            [
                (
                    "bar",
                    distribution,
                    plugin_module("bar", _bar(distribution, "cpu"), _bar(distribution, "gpu")),
                )
            ]
        )
        assert "bar" not in reg.backends
        [error] = reg.errors
        assert (error.plugin, error.distribution) == ("bar", distribution)
        assert "registered backend name 'bar' 2 times" in str(error)
        assert "must register each name once" in str(error) and "uninstall" not in str(error)

    def test_an_intruder_is_told_the_name_is_the_owners_when_the_owner_registers_it_twice(self):
        """The owner's double registration voids its claims, and a third party claiming the
        name is still told the name belongs to the owner."""
        owner, other = "genlm-backend-bar", "acme-bar"
        reg = Registry()
        reg.register_plugins(
            [
                ("bar", owner, plugin_module("bar", _bar(owner, "cpu"), _bar(owner, "gpu"))),
                ("acme", other, plugin_module("acme", _bar(other, "fast"))),
            ]
        )
        assert "bar" not in reg.backends
        lines = {error.distribution: str(error) for error in reg.errors}
        assert len(reg.errors) == 2
        assert "registered backend name 'bar' 2 times" in lines[owner]
        assert "belongs to genlm-backend-bar" in lines[other]

    def test_asking_for_a_broken_plugins_backend_says_it_failed(self, make_module, installed):
        """backend='foo' whose installed plugin fails to import names that failure, not a
        pip install of the distribution already installed."""
        broken = make_module("raise ImportError('genlm_missing_dependency_1f2e')")
        installed([("foo", broken, "genlm-backend-foo")])
        reg = Registry.discover()
        with pytest.raises(BackendNotFoundError) as raised:
            reg.select("foo")
        message = str(raised.value)
        assert "installed but its plugin failed to load" in message
        assert "genlm_missing_dependency_1f2e" in message and "pip install" not in message

    def test_an_owner_whose_plugin_failed_keeps_its_name_from_another_claim(
        self, make_module, installed
    ):
        """genlm-backend-foo is installed but its plugin fails to import (built for a newer
        core): a fork's claim on `foo` is not served in its place, and is reported; asking
        for `foo` says it is installed, not to pip install it (the fork's loader was
        silently served as `foo`, and nothing reported the fork)."""
        owner = make_module("from genlm.core.backend import SomethingFromANewerCore\n")
        fork = backend_plugin(make_module, "foo", "genlm-foo-fork", "fork")
        installed([("foo", owner, "genlm-backend-foo"), ("foofork", fork, "genlm-foo-fork")])
        reg = Registry.discover()
        assert "foo" not in reg.backends
        lines = {(e.plugin, e.distribution): str(e) for e in reg.errors}
        assert set(lines) == {("foo", "genlm-backend-foo"), ("foofork", "genlm-foo-fork")}
        assert "SomethingFromANewerCore" in lines["foo", "genlm-backend-foo"]
        assert "belongs to genlm-backend-foo" in lines["foofork", "genlm-foo-fork"]
        with pytest.raises(BackendNotFoundError) as raised:
            reg.load_model("stories260K", backend="foo")
        message = str(raised.value)
        assert message.startswith("backend 'foo' is installed but its plugin failed to load")
        assert "SomethingFromANewerCore" in message and "to install it" not in message

    def test_an_owner_refused_by_pluggy_keeps_its_name_from_another_claim(self, make_module):
        """The same when the owner's plugin is invalid (a hook taking an argument the spec
        does not have): a plugin reported broken on any path keeps its names from others."""
        owner = make_module(
            """
            from genlm.core.hookspecs import hookimpl

            @hookimpl
            def genlm_register_backends(register, extra):
                pass
            """
        )
        fork = backend_plugin(make_module, "foo", "genlm-foo-fork", "fork")
        reg = Registry()
        reg.register_plugins(
            [
                ("foo", "genlm-backend-foo", importlib.import_module(owner)),
                ("foofork", "genlm-foo-fork", importlib.import_module(fork)),
            ]
        )
        assert "foo" not in reg.backends
        assert {e.plugin for e in reg.errors} == {"foo", "foofork"}

    @pytest.mark.parametrize("victim", ["aaa", "zzz"])
    def test_an_intruding_claim_does_not_mark_its_distribution_as_failed(self, victim):
        """genlm-backend-VICTIM loads fine but also claims another owner's name: that claim
        is refused, and a lone third party's claim on VICTIM is still served, whatever the
        names' order (a refused claim counted as a failed plugin, so VICTIM went unserved
        when it sorted after the other name, said to be "installed but failed to load")."""

        def spec(name: str, dist: str) -> BackendSpec:
            return BackendSpec(name=name, loader=MOCK_LOADER, distribution=dist, plugin_api=1)

        own = f"genlm-backend-{victim}"
        reg = Registry()
        reg.register_plugins(
            [
                ("v", own, plugin_module("v", spec("mmm", own))),
                ("m", "genlm-backend-mmm", plugin_module("m", spec("mmm", "genlm-backend-mmm"))),
                ("acme", "acme", plugin_module("acme", spec(victim, "acme"))),
            ]
        )
        assert reg.backends[victim].distribution == "acme"
        assert reg.backends["mmm"].distribution == "genlm-backend-mmm"
        assert [(e.plugin, e.distribution) for e in reg.errors] == [("v", own)]

    def test_a_name_a_plugin_registers_twice_is_installed_not_unknown(self):
        """A third party's plugin registering `bar` twice with different specs: asking for
        `bar` says it is installed but served by nobody, and why (it said "unknown backend
        'bar'" and to pip install genlm-backend-bar)."""
        reg = Registry()
        reg.register_plugins(
            [
                (
                    "acme",
                    "acme-tools",
                    plugin_module("acme", _bar("acme-tools", "cpu"), _bar("acme-tools", "gpu")),
                )
            ]
        )
        assert "bar" not in reg.backends
        [error] = reg.errors
        with pytest.raises(BackendNotFoundError) as raised:
            reg.load_model("stories260K", backend="bar")
        message = str(raised.value)
        assert message.startswith("backend 'bar' is installed but not served: ")
        assert "it registered backend name 'bar' 2 times, with different specs" in message
        assert message.endswith(str(error).split(": ", 1)[1])
        assert "unknown backend" not in message and "pip install" not in message

    def test_a_single_third_party_claim_is_used(self, make_module, installed):
        """An unowned name claimed once is simply that plugin's backend."""
        mod = backend_plugin(make_module, "foo", "genlm-a", "a")
        installed([("a", mod, "genlm-a")])
        reg = Registry.discover()
        assert reg.backends["foo"].description == "a" and reg.errors == []

    def test_owner_name_is_normalized(self, make_module, installed):
        """`Genlm_Backend.HF` is genlm-backend-hf (PEP 503 names)."""
        real = backend_plugin(make_module, "hf", "genlm-backend-hf", "real")
        fake = backend_plugin(make_module, "hf", "x", "intruder")
        installed([("hf", real, "Genlm_Backend.HF"), ("a", fake, "aaa")])
        assert Registry.discover().backends["hf"].description == "real"

    def test_cli_reports_the_intruder(self, make_module, installed, process_registry, capsys):
        """`genlm backends --json` shows the owner's backend and the intruder as broken."""
        real = backend_plugin(make_module, "hf", "genlm-backend-hf", "real")
        fake = backend_plugin(make_module, "hf", "genlm-fast-hf", "intruder")
        installed([("hf", fake, "genlm-fast-hf"), ("hf", real, "genlm-backend-hf")])
        assert main(["backends", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert [b["description"] for b in report["backends"]] == ["real"]
        assert [b["distribution"] for b in report["broken"]] == ["genlm-fast-hf"]


class TestAvailability:
    """Issue 12 item 16: a missing loader module is unavailable; auto-selection falls back."""

    def test_missing_loader_module_is_unavailable(self, make_module, installed):
        """A loader naming a module that does not exist is unavailable and never auto-selected."""
        ghost = backend_plugin(
            make_module,
            "ghost",
            "genlm-backend-ghost",
            loader="genlm_no_such_module_5f3a:load",
            priority=50,
            auto_select=True,
        )
        good = backend_plugin(
            make_module, "good", "genlm-backend-good", priority=1, auto_select=True
        )
        installed([("ghost", ghost, "genlm-backend-ghost"), ("good", good, "genlm-backend-good")])
        reg = Registry.discover()
        reason = reg.backends["ghost"].unavailable_reason()
        assert reason is not None and "genlm_no_such_module_5f3a" in reason
        assert reg.select().name == "good"
        with pytest.raises(BackendUnavailableError, match="genlm_no_such_module_5f3a"):
            reg.select("ghost")

    def test_missing_loader_parent_package_is_unavailable(self):
        """find_spec of a submodule of a missing package is a reason, not an exception."""
        spec = BackendSpec(
            name="g", loader="genlm_no_pkg_9c1e.sub.mod:load", distribution="d", plugin_api=1
        )
        assert "genlm_no_pkg_9c1e" in spec.unavailable_reason()

    def test_a_loader_naming_no_callable_is_an_import_error_naming_it(self, make_module):
        """BackendSpec.import_loader: a loader path whose module lacks the callable is an
        ImportError ("cannot import name", as importlib says) naming the loader string."""
        module = make_module("class Model:\n    pass\n")
        spec = BackendSpec(
            name="g", loader=f"{module}:Model.from_nam", distribution="d", plugin_api=1
        )
        with pytest.raises(ImportError, match=f"cannot import name 'Model.from_nam' .*{module}"):
            spec.import_loader()

    def test_availability_check_does_not_import_the_loader(self, make_module):
        """Checking availability finds the loader module without running it."""
        loader = make_module("import sys\nsys.modules['genlm_probe_ran_marker'] = True\n")
        spec = BackendSpec(name="g", loader=f"{loader}:load", distribution="d", plugin_api=1)
        assert spec.unavailable_reason() is None
        assert loader not in sys.modules and "genlm_probe_ran_marker" not in sys.modules

    def test_auto_selection_falls_back_when_the_chosen_backend_fails_to_import(
        self, make_module, monkeypatch
    ):
        """The best backend's module exists but raises ImportError: warn, load the next one."""
        broken = make_module("raise ImportError('libcuda.so.1: cannot open shared object file')\n")
        _serve_top_over_mock(monkeypatch, broken)
        with pytest.warns(RuntimeWarning, match="'top' was chosen but importing .*libcuda"):
            lm = load_model_by_name("stories260K")
        assert isinstance(lm, MockLM)
        lm.close()

    def test_the_cli_loader_falls_back_as_load_model_by_name_does(self, make_module, monkeypatch):
        """genlm.core.cli.load_model (genlm smc, genlm bytes) with no backend named: the
        chosen backend failing to import is skipped with the same warning."""
        from genlm.core.cli import load_model

        broken = make_module("raise ImportError('libcuda.so.1: cannot open shared object file')\n")
        _serve_top_over_mock(monkeypatch, broken)
        with pytest.warns(RuntimeWarning, match="'top' was chosen but importing .*libcuda"):
            lm = load_model("stories260K", None)
        assert isinstance(lm, MockLM)
        lm.close()
        with pytest.raises(ImportError, match="libcuda"):  # named: no fallback
            load_model("stories260K", "top")

    def test_no_fallback_when_the_backend_is_named(self, make_module, monkeypatch):
        """backend='top' whose module fails to import raises that error; the mock backend
        below it is not loaded instead."""
        broken = make_module("raise ImportError('no libcuda here')\n")
        _serve_top_over_mock(monkeypatch, broken)
        with pytest.raises(ImportError, match="no libcuda here"):
            load_model_by_name("stories260K", backend="top")

    @pytest.mark.parametrize(
        ("source", "attribute", "original"),
        [
            ("raise ImportError('libfoo.so missing')\n", "load", "libfoo.so missing"),
            ("def load(model, **opts):\n    pass\n", "Nope", "cannot import name 'Nope'"),
            ("import genlm_no_such_dependency\n", "load", "'genlm_no_such_dependency'"),
            ("raise OSError('libcudart.so.13: cannot open')\n", "load", "libcudart.so.13"),
            ("raise RuntimeError('engine built for CUDA 12')\n", "load", "CUDA 12"),
        ],
        ids=["module-raises", "no-such-callable", "missing-dependency", "oserror", "runtime"],
    )
    def test_a_named_backend_whose_loader_fails_to_import_is_named(
        self, make_module, monkeypatch, source, attribute, original
    ):
        """backend='top' whose loader module raises (ImportError, or what a broken engine
        raises at import: OSError, RuntimeError), or lacks the callable the loader names: an
        ImportError naming the backend, its plugin and distribution and the loader string,
        with the original error (an AttributeError, a RuntimeError were bare), of the
        original's class when that is an ImportError (a missing dependency stays a
        ModuleNotFoundError)."""
        module = make_module(source)
        reg = _registry_of(
            BackendSpec(name="top", loader=f"{module}:{attribute}", distribution="d", plugin_api=1)
        )
        monkeypatch.setattr(_registry, "_registry", reg)
        with pytest.raises(ImportError) as raised:
            load_model_by_name("stories260K", backend="top")
        message = str(raised.value)
        assert message.startswith(
            f"backend 'top' (plugin 'top', distribution genlm-backend-top): cannot import its "
            f"loader {module}:{attribute}: "
        )
        assert original in message
        cause = raised.value.__cause__
        if isinstance(cause, ImportError):  # a missing dependency stays what it was
            assert type(raised.value) is type(cause)
        else:  # a module raising anything else at import failed to import: named, class shown
            assert type(raised.value) is ImportError and type(cause).__name__ in message

    def test_a_named_backend_whose_loader_calls_sys_exit_is_an_import_error(
        self, make_module, monkeypatch
    ):
        """backend='top' whose loader module calls sys.exit at import (a package giving up
        on a missing GPU): an ImportError naming the backend and the SystemExit, and the
        caller goes on (the SystemExit went through and ended the caller's program)."""
        module = make_module("import sys\nsys.exit('no CUDA device, giving up')\n")
        reg = _registry_of(
            BackendSpec(name="top", loader=f"{module}:load", distribution="d", plugin_api=1)
        )
        monkeypatch.setattr(_registry, "_registry", reg)
        try:
            load_model_by_name("stories260K", backend="top")
        except ImportError as exc:
            raised = exc
        except SystemExit as exc:
            pytest.fail(f"load_model_by_name let the loader's SystemExit through: {exc!r}")
        else:
            pytest.fail("load_model_by_name loaded a backend whose loader exits at import")
        assert type(raised) is ImportError and isinstance(raised.__cause__, SystemExit)
        assert str(raised) == (
            "backend 'top' (plugin 'top', distribution genlm-backend-top): cannot import its "
            f"loader {module}:load: SystemExit('no CUDA device, giving up')"
        )

    def test_loader_errors_are_not_masked_by_fallback(self, make_module, monkeypatch):
        """A loader that imports fine but rejects the model raises; no other backend is tried."""
        picky = make_module("def load(model, **opts):\n    raise ValueError(f'no model {model}')\n")
        _serve_top_over_mock(monkeypatch, picky)
        with pytest.raises(ValueError, match="no model nope"):
            load_model_by_name("nope")

    def test_every_usable_backend_failing_to_import_is_not_found(self, make_module):
        """When each candidate fails to import, the error lists each failure."""
        broken = make_module("raise ImportError('gone')\n")
        reg = _registry_of(
            BackendSpec(
                name="top",
                loader=f"{broken}:load",
                distribution="d",
                plugin_api=1,
                auto_select=True,
            ),
        )
        with (
            pytest.warns(RuntimeWarning),
            pytest.raises(BackendNotFoundError, match="top: importing"),
        ):
            reg.load_model("stories260K")


class TestVersionHints:
    def test_a_plugin_for_another_core_is_told_which_upgrade_fixes_it(self, make_module, installed):
        """A plugin using a BackendSpec field this core lacks, or importing a genlm.core
        name it lacks, fails before the version check can run: its line still names this
        core's plugin API and the upgrade. An unrelated failure gets no such note."""
        newer = make_module(
            """
            from genlm.core.backend import BackendSpec, backend_hook

            genlm_register_backends = backend_hook(
                lambda: BackendSpec(
                    name="n", loader="a:b", distribution="genlm-backend-n", plugin_api=2,
                    context_hint=4096,
                )
            )
            """
        )
        older = make_module("from genlm.core.backend import a_name_core_dropped\n")
        other = make_module("raise ImportError('libfoo.so: cannot open shared object file')\n")
        installed(
            [
                ("n", newer, "genlm-backend-n"),
                ("o", older, "genlm-backend-o"),
                ("x", other, "genlm-backend-x"),
            ]
        )
        lines = {error.plugin: str(error) for error in Registry.discover().errors}
        hint = f"serves plugin API {PLUGIN_API}): pip install --upgrade genlm-core genlm-backend-"
        assert "context_hint" in lines["n"] and lines["n"].endswith(hint + "n")
        assert "a_name_core_dropped" in lines["o"] and lines["o"].endswith(hint + "o")
        assert "libfoo" in lines["x"] and "plugin API" not in lines["x"]

    def test_the_hint_without_a_distribution_names_no_package_that_is_not_one(self):
        """A plugin of unknown distribution: the hint's pip command names genlm-core alone."""
        hint = mismatch_hint(ImportError("gone", name="genlm.core.backend"), None)
        assert hint.endswith("pip install --upgrade genlm-core, and upgrade the plugin")


class TestIsolation:
    """Issue 12 item 17: any BaseException but KeyboardInterrupt stays in its plugin."""

    def test_sys_exit_at_plugin_import_is_reported(self, make_module, installed):
        """A plugin calling sys.exit at import is broken; discovery goes on."""
        exiting = make_module("import sys\nsys.exit(3)\n")
        good = backend_plugin(make_module, "good", "genlm-backend-good")
        installed([("aaa", exiting, "genlm-backend-aaa"), ("good", good, "genlm-backend-good")])
        reg = Registry.discover()
        assert list(reg.backends) == ["good"]
        [error] = reg.errors
        assert error.plugin == "aaa" and "SystemExit(3)" in str(error)
        assert isinstance(error.__cause__, SystemExit)

    def test_sys_exit_in_a_hook_is_reported(self):
        """A hook raising SystemExit (or GeneratorExit) is broken; the others register."""
        reg = Registry()
        reg.register_plugins(
            [
                ("exit", "d1", plugin_module("exit", raises=SystemExit(1))),
                ("gen", "d2", plugin_module("gen", raises=GeneratorExit())),
                (
                    "ok",
                    "d3",
                    plugin_module(
                        "ok",
                        BackendSpec(name="ok", loader=MOCK_LOADER, distribution="d3", plugin_api=1),
                    ),
                ),
            ]
        )
        assert list(reg.backends) == ["ok"]
        assert [e.plugin for e in reg.errors] == ["exit", "gen"]

    def test_probe_calling_sys_exit_makes_the_backend_unavailable(self):
        """A probe that exits is a reason the backend is unavailable, not the end of the process."""

        def probe():
            sys.exit("no GPU driver")

        spec = BackendSpec(
            name="p", loader=MOCK_LOADER, distribution="d", plugin_api=1, probe=probe
        )
        assert "no GPU driver" in spec.unavailable_reason()

    @pytest.mark.parametrize("returned", [True, False, "", "  ", 0, ["no GPU"]])
    def test_a_probe_returning_neither_none_nor_a_reason_is_broken(self, returned):
        """A probe returning True, False, a blank string or another non-string is broken,
        like one that raises: the backend is unavailable, the reason naming what the probe
        returned and what it should (True made it "unavailable: True", "" unavailable
        with no reason)."""
        spec = BackendSpec(
            name="p", loader=MOCK_LOADER, distribution="d", plugin_api=1, probe=lambda: returned
        )
        reason = spec.unavailable_reason()
        assert reason.startswith(f"availability probe failed: it returned {returned!r}, ")
        assert "None" in reason and "non-empty string" in reason
        reg = _registry_of(spec)
        with pytest.raises(BackendUnavailableError, match="availability probe failed"):
            reg.select("p")

    def test_a_probe_reason_is_the_backends(self):
        """A probe's reason (a string) is the reason; None means available."""
        for returned in (None, "no CUDA GPU"):
            spec = BackendSpec(
                name="p",
                loader=MOCK_LOADER,
                distribution="d",
                plugin_api=1,
                probe=lambda returned=returned: returned,
            )
            assert spec.unavailable_reason() == returned

    def test_keyboard_interrupt_at_import_propagates(self, make_module, installed):
        """Ctrl-C during a slow plugin import still stops the program."""
        interrupted = make_module("raise KeyboardInterrupt\n")
        installed([("slow", interrupted, "genlm-backend-slow")])
        with pytest.raises(KeyboardInterrupt):
            Registry.discover()

    def test_cli_survives_a_plugin_calling_sys_exit(
        self, make_module, installed, process_registry, capsys
    ):
        """`genlm backends` lists the rest and the exiting plugin as broken, status 0."""
        exiting = make_module("raise SystemExit('bye')\n")
        installed(
            [
                ("bye", exiting, "genlm-backend-bye"),
                ("mock", "genlm.core.mock_plugin", "genlm-core"),
            ]
        )
        assert main(["backends"]) == 0
        out = capsys.readouterr().out
        assert "mock" in out and "broken plugin bye (genlm-backend-bye)" in out

    @pytest.mark.parametrize("where", ["import", "import-typeerror", "hook", "probe"])
    def test_an_exception_that_cannot_show_itself_breaks_only_its_plugin(
        self, make_module, installed, process_registry, capsys, where
    ):
        """A plugin raising, at import, in its hook or in its probe, an exception whose
        repr and str raise is reported by its class name, and the rest work (discovery
        died formatting it, so every genlm command and load_model_by_name failed; a
        probe's failed `genlm backends`)."""
        ugly = textwrap.dedent(
            """
            class Ugly(Exception):
                def __repr__(self):
                    raise RuntimeError("repr broken")

                def __str__(self):
                    raise RuntimeError("str broken")
            """
        )
        hook = """
            from genlm.core.hookspecs import hookimpl

            @hookimpl
            def genlm_register_backends(register):
                raise Ugly()
            """
        probe = f"""
            from genlm.core.backend import BackendSpec, backend_hook

            def probe():
                raise Ugly()

            genlm_register_backends = backend_hook(
                BackendSpec(name="ugly", loader={MOCK_LOADER!r},
                            distribution="genlm-backend-ugly", plugin_api=1, probe=probe)
            )
            """
        sources = {
            "import": ugly + "raise Ugly()\n",
            # a TypeError's str is read to tell a newer plugin's unknown field
            "import-typeerror": ugly.replace("(Exception)", "(TypeError)") + "raise Ugly()\n",
            "hook": ugly + textwrap.dedent(hook),
            "probe": ugly + textwrap.dedent(probe),
        }
        module = make_module(sources[where])
        installed(
            [
                ("ugly", module, "genlm-backend-ugly"),
                ("mock", "genlm.core.mock_plugin", "genlm-core"),
            ]
        )
        assert main(["backends", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        rows = {row["name"]: row for row in report["backends"]}
        if where == "probe":
            assert report["broken"] == []
            assert rows["ugly"]["available"] is False
            assert rows["ugly"]["status"].startswith("unavailable: availability probe failed: Ugly")
        else:
            [broken] = report["broken"]
            assert (broken["plugin"], broken["distribution"]) == ("ugly", "genlm-backend-ugly")
            assert "Ugly" in broken["error"]
            [error] = _registry.get_registry().errors
            assert type(error.__cause__).__name__ == "Ugly"  # what the plugin raised
        assert rows["mock"]["available"] is True
        lm = load_model_by_name("stories260K", backend="mock")
        assert isinstance(lm, MockLM)
        lm.close()

    def test_every_other_report_survives_an_exception_that_cannot_show_itself(
        self, make_module, installed, process_registry, capsys, monkeypatch
    ):
        """The same exception from a command's setup, from a named backend's loader (an
        ImportError subclass whose str raises), and from a loader's parent package at
        import (what ``genlm backends`` probes): each is one report naming its class."""
        ugly = make_module(
            """
            class Ugly(ImportError):
                def __repr__(self):
                    raise RuntimeError("repr broken")

                def __str__(self):
                    raise RuntimeError("str broken")
            """
        )
        setup = make_module(
            f"""
            from genlm.core.cli import Command, command_hook
            from {ugly} import Ugly

            def configure(parser):
                raise Ugly()

            genlm_register_commands = command_hook(
                Command(name="ugly", help="h", configure=configure, run=lambda a: 0)
            )
            """
        )
        installed([("setup", setup, "genlm-cmd-ugly")])
        assert main(["backends"]) == 0
        assert main(["ugly"]) == 1
        assert "failed to set it up: Ugly (whose repr raised RuntimeError)" in (
            capsys.readouterr().err
        )
        loader = make_module(f"from {ugly} import Ugly\nraise Ugly()\n")
        reg = _registry_of(
            BackendSpec(name="top", loader=f"{loader}:load", distribution="d", plugin_api=1)
        )
        monkeypatch.setattr(_registry, "_registry", reg)
        with pytest.raises(ImportError, match="Ugly \\(whose repr raised RuntimeError\\)"):
            load_model_by_name("stories260K", backend="top")
        package = make_module(f"from {ugly} import Ugly\nraise Ugly()\n")
        spec = BackendSpec(name="pkg", loader=f"{package}.sub:load", distribution="d", plugin_api=1)
        sys.modules.pop(package, None)
        assert "Ugly (whose repr raised RuntimeError)" in spec.unavailable_reason()

    def test_plugin_prints_do_not_corrupt_backends_json(
        self, make_module, installed, process_registry, capsys
    ):
        """A plugin printing at import and in its probe: `genlm backends --json` writes
        the JSON alone to stdout, the prints go to stderr (they came first on stdout,
        and the output was not JSON)."""
        loud = make_module(
            f"""
            from genlm.core.backend import BackendSpec, backend_hook

            print("loud plugin imported")

            def probe():
                print("probing the GPU...")

            genlm_register_backends = backend_hook(
                BackendSpec(name="loud", loader={MOCK_LOADER!r},
                            distribution="genlm-backend-loud", plugin_api=1, probe=probe)
            )
            """
        )
        installed([("loud", loud, "genlm-backend-loud")])
        assert main(["backends", "--json"]) == 0
        captured = capsys.readouterr()
        report = json.loads(captured.out)
        [row] = report["backends"]
        assert row["name"] == "loud" and row["available"] is True
        assert captured.err.splitlines() == ["loud plugin imported", "probing the GPU..."]

    def test_cli_interrupted_during_a_plugin_import_says_so_in_one_line(
        self, make_module, installed, process_registry, capsys
    ):
        """Ctrl-C while discovery imports a slow plugin ends `genlm` with status 130 and
        "genlm: interrupted", as during a command (discovery ran before main's handler:
        the KeyboardInterrupt escaped with a traceback)."""
        interrupted = make_module("raise KeyboardInterrupt\n")
        installed([("slow", interrupted, "genlm-backend-slow")])
        try:
            status = main(["backends"])
        except KeyboardInterrupt:  # caught here: one escaping would stop the whole test run
            pytest.fail("the KeyboardInterrupt escaped main()")
        assert status == 130
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", "genlm: interrupted\n")


def test_a_command_of_a_hidden_plugin_blames_the_allowlist(
    make_module, installed, process_registry, monkeypatch, capsys
):
    """`genlm hello` when GENLM_BACKENDS hid the plugin adding it: the usage error names
    the variable and what it hid (it read as a command never installed)."""
    hello = make_module(
        """
        from genlm.core.cli import Command, command_hook

        genlm_register_commands = command_hook(
            Command(name="hello", help="greets", configure=lambda p: None, run=lambda a: 0)
        )
        """
    )
    installed([("hello", hello, "genlm-hello"), ("mock", "genlm.core.mock_plugin", "genlm-core")])
    monkeypatch.setenv("GENLM_BACKENDS", "mock")
    with pytest.raises(SystemExit) as exit_:
        main(["hello"])
    assert exit_.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "invalid choice: 'hello'" in line
    assert "GENLM_BACKENDS='mock' hides the installed plugins hello" in line
    monkeypatch.delenv("GENLM_BACKENDS")
    _registry.get_registry(refresh=True)
    assert main(["hello"]) == 0  # shown, it runs


@pytest.mark.parametrize(
    "fields",
    [{"name": 7}, {"name": None}, {"name": "Two Words"}, {"help": 3}, {"run": "main"}],
    ids=["int-name", "no-name", "bad-name", "int-help", "run-not-callable"],
)
def test_a_command_with_a_bad_field_breaks_only_its_plugin(
    make_module, installed, process_registry, capsys, fields
):
    """A plugin making a Command with a malformed field (name=7) is refused when it makes
    it, so that plugin is broken and every other command works (the Command was accepted,
    and `genlm`, `genlm --help` and `genlm backends` all died sorting the command names,
    next to any other plugin command)."""
    made = {"name": "bad", "help": "h", "configure": lambda parser: None, "run": lambda a: 0}
    with pytest.raises((TypeError, ValueError)) as refused:
        Command(**{**made, **fields})
    source = {"name": "'bad'", "help": "'h'", "configure": "lambda p: None", "run": "lambda a: 0"}
    source.update({k: repr(v) for k, v in fields.items()})
    arguments = ", ".join(f"{k}={v}" for k, v in source.items())
    bad = make_module(
        f"""
        from genlm.core.cli import Command, command_hook

        genlm_register_commands = command_hook(Command({arguments}))
        """
    )
    good = make_module(
        """
        from genlm.core.cli import Command, command_hook

        genlm_register_commands = command_hook(
            Command(name="bee", help="buzzes", configure=lambda p: None, run=lambda a: 7)
        )
        """
    )
    installed([("a", bad, "genlm-cmd-a"), ("b", good, "genlm-cmd-b")])
    assert main(["backends"]) == 0
    assert "broken plugin a (genlm-cmd-a)" in capsys.readouterr().out
    [error] = _registry.get_registry().errors
    assert type(error.__cause__) is refused.type  # the plugin failed making its Command
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "buzzes" in capsys.readouterr().out
    assert main(["bee"]) == 7


def _serve_top_over_mock(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """Make ``load_model_by_name`` see backend ``top`` (loader ``module:load``, priority 9)
    ranked over the mock backend ``m`` (priority 1)."""
    reg = _registry_of(
        BackendSpec(
            name="top",
            loader=f"{module}:load",
            distribution="d",
            plugin_api=1,
            priority=9,
            auto_select=True,
        ),
        BackendSpec(
            name="m",
            loader=MOCK_LOADER,
            distribution="d",
            plugin_api=1,
            priority=1,
            auto_select=True,
        ),
    )
    monkeypatch.setattr(_registry, "_registry", reg)


def _registry_of(*specs: BackendSpec) -> Registry:
    """A registry with one in-memory plugin per spec, named after the backend, from the
    distribution ``genlm-backend-<name>``."""
    reg = Registry()
    reg.register_plugins(
        [(s.name, f"genlm-backend-{s.name}", plugin_module(s.name, s)) for s in specs]
    )
    return reg


def _bar(distribution: str, description: str) -> BackendSpec:
    """A spec of the mock loader under the name ``bar``, from ``distribution``."""
    return BackendSpec(
        name="bar",
        loader=MOCK_LOADER,
        distribution=distribution,
        plugin_api=1,
        description=description,
    )


@pytest.mark.parametrize("name", ["/nonexistent/model", "./missing-dir", "~/no/such/model"])
def test_a_missing_local_model_path_is_named_before_any_loader_runs(name):
    """A name that can only be a local path (not a hub id), with nothing there, is a
    FileNotFoundError naming it from every backend (they all resolve names through
    ``resolve_model_path``), where a loader took it for a hub id (transformers: "Repo id
    must use alphanumeric chars", seconds later)."""
    from genlm.core.backend import resolve_model_path

    with pytest.raises(FileNotFoundError, match=f"model path '{re.escape(name)}' does not exist"):
        resolve_model_path(name)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model_by_name(name, backend="mock")


def test_a_local_model_path_has_its_home_expanded(tmp_path, monkeypatch):
    """``~/x`` reaches the loader as the folder it names (the loaders do not expand ``~``);
    hub ids and embedded names are passed on as they are."""
    from genlm.core.backend import resolve_model_path

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "model").mkdir()
    assert resolve_model_path("~/model") == str(tmp_path / "model")
    assert resolve_model_path("owner/name") == "owner/name"
    assert resolve_model_path("stories260K").endswith("stories260K")


def test_a_model_path_given_as_a_path_object_is_resolved_as_its_string(tmp_path, monkeypatch):
    """A ``pathlib.Path`` is checked and expanded like the same path written as a string:
    a missing one is a FileNotFoundError naming it, ``~`` is expanded (a Path was returned
    unchanged, so a loader took a missing or ``~`` path for a hub id)."""
    from pathlib import Path

    from genlm.core.backend import resolve_model_path

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "model").mkdir()
    with pytest.raises(FileNotFoundError, match="model path '/nonexistent/model' does not exist"):
        resolve_model_path(Path("/nonexistent/model"))
    with pytest.raises(FileNotFoundError, match="model path '~/no/such/model' does not exist"):
        resolve_model_path(Path("~/no/such/model"))
    assert resolve_model_path(Path("~/model")) == str(tmp_path / "model")
    assert resolve_model_path(tmp_path / "model") == str(tmp_path / "model")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model_by_name(Path("/nonexistent/model"), backend="mock")
    # A path object is a local path even where its string could be a hub id or an
    # embedded model's name.
    monkeypatch.chdir(tmp_path)
    for name in ("no-such-dir", "owner/name", "stories260K"):
        with pytest.raises(FileNotFoundError, match=f"model path '{name}' does not exist"):
            resolve_model_path(Path(name))
    assert resolve_model_path(Path("model")) == "model"


@pytest.mark.parametrize(
    ("backend", "error", "match"),
    [
        (b"mock", TypeError, "backend must be a backend name \\(str\\) or None, got b'mock'"),
        (["mock"], TypeError, "got \\['mock'\\]"),
        ("", ValueError, "backend is empty"),
        ("  ", ValueError, "backend is empty"),
    ],
)
def test_a_backend_that_is_no_name_is_refused(backend, error, match):
    """backend= must be a name: bytes were looked up and suggested "pip install
    genlm-backend-b'mock'", an empty string "pip install genlm-backend-", a list failed
    with a bare "unhashable type"."""
    with pytest.raises(error, match=match):
        load_model_by_name("stories260K", backend=backend)
