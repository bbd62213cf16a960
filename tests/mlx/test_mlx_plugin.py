"""Registration of the mlx backend: cheap plugin, importability probe, platform auto-select."""

from __future__ import annotations

from support.imports import modules_loaded_by

from genlm.backends.mlx import plugin
from genlm.core.backend import BackendSpec


def _registered() -> BackendSpec:
    specs = []
    plugin.genlm_register_backends(specs.append)
    (spec,) = specs
    return spec


def test_registered_spec():
    """The backend is named mlx, priority 20, and loadable here because mlx is importable."""
    spec = _registered()
    assert (spec.name, spec.priority, spec.distribution) == ("mlx", 20, "genlm-backend-mlx")
    assert spec.unavailable_reason() is None


def test_auto_select_only_on_apple_silicon(monkeypatch):
    """backend=None may pick mlx on Darwin arm64 only; elsewhere it must be named."""
    for system, machine, expected in [
        ("Darwin", "arm64", True),
        ("Darwin", "x86_64", False),
        ("Linux", "aarch64", False),
    ]:
        monkeypatch.setattr(plugin.platform, "system", lambda s=system: s)
        monkeypatch.setattr(plugin.platform, "machine", lambda m=machine: m)
        assert _registered().auto_select is expected


def test_probe_names_missing_packages(monkeypatch):
    """Without mlx_lm the probe says what is missing and how to install it."""
    real = plugin.importlib.util.find_spec
    monkeypatch.setattr(
        plugin.importlib.util, "find_spec", lambda n: None if n == "mlx_lm" else real(n)
    )
    reason = plugin.unavailable_reason()
    assert "mlx_lm not installed" in reason and "pip install genlm-backend-mlx" in reason


def test_plugin_import_does_not_import_mlx():
    """Discovery imports the plugin module without importing mlx, mlx_lm or torch."""
    heavy = ("mlx", "mlx_lm", "torch")
    assert modules_loaded_by("import genlm.backends.mlx.plugin", heavy) == []


def test_explicit_backend_loads_through_registry():
    """load_model_by_name(..., backend="mlx") returns an MLXLM on any platform."""
    from genlm.backends.mlx import MLXLM
    from genlm.core import load_model_by_name

    lm = load_model_by_name("stories260K", backend="mlx")
    try:
        assert isinstance(lm, MLXLM) and len(lm.vocab) == 512
    finally:
        lm.close()
