"""The genlm CLI, run in-process."""

import json
import subprocess
import sys

import pytest

from genlm.core import _registry
from genlm.core.cli import main


@pytest.fixture
def fresh_registry():
    """Rediscover plugins for this test and forget them afterwards."""
    _registry.get_registry(refresh=True)
    yield
    _registry._registry = None


def test_backends_json_lists_mock_with_its_distribution(capsys, fresh_registry):
    """`genlm backends --json` reports each backend's distribution, version and status."""
    assert main(["backends", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [mock] = [b for b in report["backends"] if b["name"] == "mock"]
    assert mock["distribution"] == "genlm-core" and mock["available"] is True
    assert mock["version"] not in ("", "?")


def test_backends_table_reports_broken_plugins(capsys, fresh_registry, monkeypatch):
    """The table names broken plugins with their import error."""
    registry = _registry.get_registry()
    from genlm.core import PluginLoadError

    registry.errors.append(
        PluginLoadError("failed to import x: ModuleNotFoundError", plugin="x", distribution="d-x")
    )
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "mock" in out and "broken plugin x (d-x)" in out and "ModuleNotFoundError" in out


def test_no_command_prints_help(capsys, fresh_registry):
    """`genlm` alone prints usage and exits with status 2."""
    assert main([]) == 2
    assert "backends" in capsys.readouterr().out


def test_smc_with_unknown_backend_fails_clearly(fresh_registry):
    """`genlm smc --backend nope` raises the not-found error with a pip hint."""
    with pytest.raises(ValueError, match="pip install genlm-backend-nope"):
        main(["smc", "hi", "--backend", "nope", "--no-progress"])


def test_console_script_runs():
    """The installed `genlm` entry point works as a separate process."""
    out = subprocess.run(
        [sys.executable, "-m", "genlm.core.cli", "backends"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "mock" in out.stdout
