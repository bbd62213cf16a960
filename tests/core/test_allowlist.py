"""GENLM_BACKENDS: case-insensitive, and a filter that hides plugins says so (issue #21, item 5)."""

import importlib.metadata

import pytest

from genlm.core import BackendNotFoundError, _registry, load_model_by_name
from genlm.core.backend import Registry
from genlm.core.cli import main


def installed_plugins() -> set[str]:
    """Entry point names of every installed plugin, read from the metadata directly."""
    return {
        ep.name
        for g in _registry.ENTRY_POINT_GROUPS
        for ep in importlib.metadata.entry_points(group=g)
    }


@pytest.fixture
def allowlist(monkeypatch):
    """Set GENLM_BACKENDS and rediscover; the process-wide registry is forgotten afterwards."""

    def set_to(value: str) -> Registry:
        monkeypatch.setenv("GENLM_BACKENDS", value)
        return _registry.get_registry(refresh=True)

    yield set_to
    _registry._registry = None


def test_names_are_case_insensitive(allowlist):
    """GENLM_BACKENDS=MOCK loads mock (names are lowercase, so MOCK can only mean mock)."""
    registry = allowlist("MOCK")
    assert set(registry.backends) == {"mock"}
    assert registry.hidden == sorted(installed_plugins() - {"mock"})


def test_backend_names_are_case_insensitive(allowlist):
    """backend="MOCK" loads the mock backend."""
    allowlist("mock")
    lm = load_model_by_name("stories260K", backend="MOCK")
    assert type(lm).__name__ == "MockLM"
    lm.close()


@pytest.mark.parametrize("value", [",", " , ", "hff"])
def test_hiding_every_plugin_names_the_variable_its_value_and_what_it_hid(allowlist, value):
    """No backend is loaded: the errors of select(name) and select() name GENLM_BACKENDS,
    its value and the installed plugins it hid, and suggest no pip install (they used to
    say "installed backends: none ... pip install")."""
    registry = allowlist(value)
    assert registry.backends == {}
    hidden = sorted(installed_plugins())
    assert registry.hidden == hidden
    for select in (lambda: registry.select("mock"), registry.select):
        with pytest.raises(BackendNotFoundError) as error:
            select()
        message = str(error.value)
        assert (
            f"GENLM_BACKENDS={value!r} hides the installed plugins {', '.join(hidden)}" in message
        )
        assert "pip install" not in message
    if value == "hff":
        assert "names no installed plugin hff" in registry.allowlist_note


def test_a_hidden_backend_is_called_installed_not_unknown(allowlist):
    """Naming a backend that GENLM_BACKENDS hid says it is installed but not loaded."""
    with pytest.raises(BackendNotFoundError, match="backend 'mock' is installed but not loaded"):
        allowlist("nothing-installed").select("mock")


def test_genlm_backends_command_says_what_is_hidden(allowlist, capsys):
    """`genlm backends` blames GENLM_BACKENDS, not a missing install."""
    allowlist(",")
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no backends loaded: GENLM_BACKENDS=',' hides the installed plugins")
    assert "mock" in out and "pip install" not in out


def test_genlm_smc_blames_the_allowlist_in_one_line(allowlist, capsys):
    """`genlm smc --backend mock` with everything hidden fails in one line naming the filter."""
    allowlist(",")
    assert main(["smc", "hi", "--backend", "mock"]) == 1
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()
    assert line.startswith("genlm smc: error: backend 'mock' is installed but not loaded: ")
    assert "GENLM_BACKENDS=','" in line and "pip install" not in line
