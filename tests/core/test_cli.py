"""The genlm CLI, run in-process."""

import json
import os
import re
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


def run_cli(argv: list[str]) -> int:
    """main()'s exit status, argparse's SystemExit included."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if any backend loader runs."""
    from genlm.core._registry import BackendSpec

    def forbidden(self, model, **opts):
        raise AssertionError(f"a model was loaded: {model!r}")

    monkeypatch.setattr(BackendSpec, "load", forbidden)


def one_line_error(capsys) -> str:
    """The single stderr line of a failed command (and nothing on stdout)."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert captured.out == "" and "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["--backend", "nope"], 1, "unknown backend 'nope'.*pip install genlm-backend-nope"),
        (["--particles", "0"], 2, "--particles: must be a positive integer, got 0"),
        (["--max-tokens", "-3"], 2, "--max-tokens: must be a positive integer"),
        (["--temperature", "0"], 2, "--temperature: must be a positive number"),
        (["--ess-threshold", "1.5"], 2, "--ess-threshold: must be between 0 and 1"),
        (["--particles", "many"], 2, "--particles: invalid positive_int value"),
        (["--model", "/nonexistent/path"], 1, "model path '/nonexistent/path' does not exist"),
        (["--model", "./missing-dir"], 1, "model path './missing-dir' does not exist"),
        (["--model", "~/no/such/model"], 1, "model path '~/no/such/model' does not exist"),
    ],
)
def test_smc_bad_arguments_are_one_line_before_loading(
    argv, status, message, capsys, fresh_registry, no_loading
):
    """Each mistake ends the command with one stderr line and a non-zero status, no model loaded."""
    assert run_cli(["smc", "hi", "--backend", "mock", "--no-progress", *argv]) == status
    line = one_line_error(capsys)
    assert line.startswith("genlm smc: error: ")
    assert re.search(message, line), line


def test_unknown_hub_model_offline_is_one_line(capsys, fresh_registry, no_loading, monkeypatch):
    """A hub id that is not cached, with HF_HUB_OFFLINE set, fails at once without the hub."""
    constants = pytest.importorskip("huggingface_hub.constants")
    from genlm.core.cli import _load

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(_load, "HUB_BACKENDS", frozenset({"mock"}))
    argv = ["smc", "hi", "--backend", "mock", "--model", "no-such-org/no-such-model-xyz"]
    assert run_cli(argv) == 1
    line = one_line_error(capsys)
    assert "'no-such-org/no-such-model-xyz' is not embedded" in line
    assert "HF_HUB_OFFLINE is set" in line


def test_unreachable_hub_is_reported_once(tmp_path):
    """With the hub unreachable (a closed local port), one request fails and one line says so."""
    pytest.importorskip("huggingface_hub")
    code = (
        "import sys\n"
        "from genlm.core.cli import _load, main\n"
        "_load.HUB_BACKENDS = frozenset({'mock'})\n"
        "sys.exit(main(['smc', 'hi', '--backend', 'mock', '--model', 'no-such-model-xyz']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "the hub at http://127.0.0.1:9 cannot be reached" in lines[0]
    assert "HF_HUB_OFFLINE=1" in lines[0]


def test_loader_failure_is_one_line(capsys, monkeypatch):
    """An exception from a backend's loader (here a multi-line one) becomes one stderr line."""
    from genlm.core._registry import BackendSpec, Registry

    def loader_fails(model, **opts):
        raise OSError("cannot load the weights\nsee the docs\nfor details")

    monkeypatch.setattr("genlm.core.mock.MockLM.from_name", loader_fails, raising=False)
    spec = BackendSpec(name="broken", loader="genlm.core.mock:MockLM.from_name", distribution="d")
    monkeypatch.setattr(_registry, "_registry", Registry(backends={"broken": spec}))
    assert run_cli(["smc", "hi", "--backend", "broken", "--no-progress"]) == 1
    line = one_line_error(capsys)
    assert line == "genlm smc: error: OSError: cannot load the weights see the docs for details"


def test_no_auto_selectable_backend_names_the_manual_ones(capsys, monkeypatch):
    """With only a backend that is never auto-selected (mlx on Linux), the error says --backend."""
    from genlm.core._registry import BackendSpec, Registry

    mlx = BackendSpec(name="mlx", loader="x.y:z", distribution="d-mlx", auto_select=False)
    monkeypatch.setattr(_registry, "_registry", Registry(backends={"mlx": mlx}))
    assert run_cli(["smc", "hi", "--no-progress"]) == 1
    line = one_line_error(capsys)
    assert "no usable backend is installed" in line
    assert "installed but never picked automatically: pass --backend mlx" in line


def test_help_shows_defaults(capsys, fresh_registry):
    """`genlm smc --help` states each option's default."""
    assert run_cli(["smc", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for default in ("(default: stories260K)", "(default: 8)", "(default: 32)", "(default: 0.5)"):
        assert default in out


def test_console_script_error_is_one_line():
    """As a separate process, an unknown backend prints one stderr line and exits 1."""
    out = subprocess.run(
        [sys.executable, "-m", "genlm.core.cli", "smc", "hi", "--backend", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("genlm smc: error: unknown backend 'nope'")


def test_console_script_runs():
    """The installed `genlm` entry point works as a separate process."""
    out = subprocess.run(
        [sys.executable, "-m", "genlm.core.cli", "backends"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "mock" in out.stdout
