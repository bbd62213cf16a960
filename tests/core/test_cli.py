"""The genlm CLI, run in-process."""

import json
import os
import re
import subprocess
import sys

import numpy as np
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
        (["--seed", "-1"], 2, "--seed: must be an integer >= 0, got -1"),
        (["--temperature", "1e-310"], 2, r"--temperature: must be at least 5.563e-309 .*1e-310"),
        (["--temperature", "nan"], 2, "--temperature: must be a positive number, got nan"),
        (["--particles", "many"], 2, "--particles: invalid positive_int value"),
        (["--model", "/nonexistent/path"], 1, "model path '/nonexistent/path' does not exist"),
        (["--model", "./missing-dir"], 1, "model path './missing-dir' does not exist"),
        (["--model", "~/no/such/model"], 1, "model path '~/no/such/model' does not exist"),
        (["--model", ""], 1, "--model is empty: name one, or leave the option out"),
        (["--backend", " "], 1, "--backend is empty: name one, or leave the option out"),
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


def test_smc_prompt_that_is_not_utf8_is_one_line_before_loading(capsys, fresh_registry, no_loading):
    """A prompt argument holding bytes the locale could not decode (``$'caf\\xe9'``: Python
    sees a surrogate) is named in one line before the model loads, as `genlm bytes` does
    (the tokenizer failed with a TypeError once the model had loaded)."""
    assert run_cli(["smc", os.fsdecode(b"caf\xe9"), "--backend", "mock", "--no-progress"]) == 1
    assert one_line_error(capsys) == (
        "genlm smc: error: the prompt is not valid UTF-8 text: b'caf\\xe9'"
    )


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
    spec = BackendSpec(
        name="broken", loader="genlm.core.mock:MockLM.from_name", distribution="d", plugin_api=1
    )
    monkeypatch.setattr(_registry, "_registry", Registry(backends={"broken": spec}))
    assert run_cli(["smc", "hi", "--backend", "broken", "--no-progress"]) == 1
    line = one_line_error(capsys)
    assert line == "genlm smc: error: OSError: cannot load the weights see the docs for details"


def test_no_auto_selectable_backend_names_the_manual_ones(capsys, monkeypatch):
    """With only a backend that is never auto-selected (mlx on Linux), the error says --backend."""
    from genlm.core._registry import BackendSpec, Registry

    # the loader must exist: availability checks that its module can be found
    mlx = BackendSpec(
        name="mlx",
        loader="genlm.core.mock:MockLM.from_name",
        distribution="d-mlx",
        plugin_api=1,
        auto_select=False,
    )
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


class _ByteTokenizer:
    """Encodes text as its UTF-8 bytes, one token per byte."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


@pytest.fixture
def byte_mock(monkeypatch, fresh_registry):
    """`--backend mock` loads a mock over the 256 bytes with a byte tokenizer (no EOS)."""
    from genlm.core.mock import MockLM

    def load(name, **opts):
        return MockLM([bytes([b]) for b in range(256)], tokenizer=_ByteTokenizer(), **opts)

    monkeypatch.setattr(MockLM, "from_name", staticmethod(load))


def parse_smc_output(out: str) -> dict:
    """The numbers and texts `genlm smc` prints."""
    lines = out.splitlines()
    weights_line = next(line for line in lines if line.startswith("particle weights: "))
    ess_line = next(line for line in lines if line.startswith("effective sample size: "))
    start = next(i for i, line in enumerate(lines) if line.startswith("posterior over "))
    posterior = [line.split("  ", 1) for line in lines[start + 1 :] if line]
    return {
        "weights": [float(w) for w in weights_line.split(": ")[1].split()],
        "ess": float(ess_line.split(": ")[1].split()[0]),
        "resampled": int(re.search(r"resampled (\d+) times", out).group(1)),
        "posterior": [(float(w), text) for w, text in posterior],
    }


def test_smc_with_forbid_shows_weights_ess_and_posterior(capsys, byte_mock):
    """With --forbid no continuation has those characters, weights differ, ESS is 1/sum(w^2).

    (Forbidden: z and y, letters that never occur in the escapes of control characters.)
    """
    argv = ["smc", "Once", "--backend", "mock", "--forbid", "zy", "--particles", "8"]
    assert main([*argv, "--max-tokens", "24", "--seed", "0", "--no-progress"]) == 0
    report = parse_smc_output(capsys.readouterr().out)
    weights = np.array(report["weights"])
    assert len(weights) == 8 and weights.sum() == pytest.approx(1, abs=1e-3)
    assert len(set(report["weights"])) > 1
    assert report["ess"] == pytest.approx(1 / np.sum(weights**2), rel=0.01)
    assert report["ess"] < 8
    texts = [text for _, text in report["posterior"]]
    assert len(texts) == len(set(texts))  # grouped by text
    assert all(text.startswith("Once") for text in texts)
    assert not any({"z", "y"} & set(text) for text in texts)
    assert sum(w for w, _ in report["posterior"]) == pytest.approx(1, abs=1e-3)


def test_smc_names_what_it_estimates_at_any_temperature(capsys, byte_mock):
    """With --forbid the estimate is log P(constraint holds) at every proposal temperature
    (the weights correct for it; it was called "log Z" unless the temperature was 1), and
    the constraint line names each forbidden character (not a substring)."""
    argv = ["smc", "Once", "--backend", "mock", "--forbid", "zy", "--max-tokens", "3"]
    assert main([*argv, "--temperature", "2", "--seed", "0", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("constraint: none of 'z', 'y' in the continuation (254 of 256")
    assert lines[1].startswith("log P(constraint holds) estimate: ")


def test_a_reader_leaving_early_ends_the_command_quietly(monkeypatch, capsys, fresh_registry):
    """`genlm backends --json | head -1`: the closed pipe ends the command with status 1 and
    no error line (it printed "error: BrokenPipeError"), and stdout no longer raises."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    stdout = open(write_end, "w", buffering=1)  # noqa: SIM115 - line-buffered; closed below
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main(["backends", "--json"]) == 1
    print("after the reader left")  # no BrokenPipeError: stdout is now the null device
    monkeypatch.undo()
    stdout.close()
    assert capsys.readouterr().err == ""


def test_a_broken_pipe_that_is_not_stdout_is_reported(monkeypatch, capsys, fresh_registry):
    """A BrokenPipeError from anything but the reader of stdout (a subprocess, an engine's
    worker) is an error line like any other, not a quiet exit."""
    import attrs

    from genlm.core.cli import _backends

    def broken(args):
        raise BrokenPipeError(32, "the engine's worker process died")

    monkeypatch.setattr(_backends, "COMMAND", attrs.evolve(_backends.COMMAND, run=broken))
    assert main(["backends"]) == 1
    assert "BrokenPipeError: [Errno 32] the engine's worker process died" in capsys.readouterr().err


def test_smc_without_a_constraint_keeps_equal_weights(capsys, byte_mock):
    """At temperature 1 without a constraint the proposal is exact: equal weights, ESS = n."""
    argv = ["smc", "Once", "--backend", "mock", "--particles", "4", "--max-tokens", "5"]
    assert main([*argv, "--seed", "1", "--no-progress"]) == 0
    report = parse_smc_output(capsys.readouterr().out)
    assert report["weights"] == [0.25] * 4
    assert report["ess"] == 4 and report["resampled"] == 0


def test_forbid_rejects_non_ascii(capsys, fresh_registry, no_loading):
    """--forbid takes ASCII only: a multi-byte character cannot be masked exactly."""
    assert run_cli(["smc", "hi", "--backend", "mock", "--forbid", "é"]) == 2
    assert "takes ASCII characters only" in one_line_error(capsys)


def use_command_plugin(monkeypatch, command) -> None:
    """Make the registry ``main`` reads hold one plugin, ``faulty`` (faulty-dist), adding
    ``command``."""
    import types

    from genlm.core._registry import Registry
    from genlm.core.cli import command_hook

    module = types.ModuleType("faulty")
    module.genlm_register_commands = command_hook(command)
    registry = Registry()
    registry.register_plugins([("faulty", "faulty-dist", module)])
    monkeypatch.setattr(_registry, "_registry", registry)


@pytest.mark.parametrize(
    "failure",
    [ValueError("bad option table"), SystemExit("bad option table")],
    ids=["raises", "exits"],
)
def test_a_plugin_command_that_fails_to_set_up_breaks_only_itself(monkeypatch, capsys, failure):
    """A plugin command whose configure raises, or calls sys.exit: the other commands work,
    `genlm backends` lists its plugin as broken, and running it ends with one line naming
    the failure (a SystemExit used to end every command, `genlm smc --help` included)."""
    from genlm.core.cli import Command

    def configure(parser):
        raise failure

    use_command_plugin(
        monkeypatch, Command(name="faulty-cmd", help="h", configure=configure, run=lambda a: 0)
    )
    assert run_cli(["smc", "--help"]) == 0
    assert "--particles" in capsys.readouterr().out
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "faulty" in out and "bad option table" in out
    assert main(["faulty-cmd"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("genlm faulty-cmd: error: this command's plugin failed to set it up")


def test_a_plugin_command_help_with_a_percent_sign_is_shown_as_written(monkeypatch, capsys):
    """A command's help is plain text: ``50% faster`` is listed by `genlm --help` and
    shown by its own --help (argparse read the ``%`` as formatting: `genlm --help` and
    `genlm` alone failed with a TypeError traceback)."""
    from genlm.core.cli import Command

    use_command_plugin(
        monkeypatch,
        Command(name="fast", help="50% faster sampling", configure=lambda p: None, run=lambda a: 0),
    )
    assert run_cli(["--help"]) == 0
    assert "50% faster sampling" in capsys.readouterr().out
    assert main([]) == 2
    assert "50% faster sampling" in capsys.readouterr().out
    assert run_cli(["fast", "--help"]) == 0
    assert "50% faster sampling" in capsys.readouterr().out
    assert main(["fast"]) == 0


def test_a_plugin_command_without_help_is_listed_and_runs(monkeypatch, capsys):
    """help=None, argparse's own "no help", lists the command without a line and runs it
    (escaping the help's % made it a broken command)."""
    from genlm.core.cli import Command

    use_command_plugin(
        monkeypatch, Command(name="quiet", help=None, configure=lambda p: None, run=lambda a: 0)
    )
    assert run_cli(["--help"]) == 0
    assert "quiet" in capsys.readouterr().out
    assert main(["quiet"]) == 0


@pytest.mark.parametrize("form", ["tokenizers", "transformers", "text-only"])
def test_encode_text_reads_every_tokenizer_form(form):
    """encode_text gives the ids of a text without added specials for a transformers
    tokenizer, a raw ``tokenizers.Tokenizer`` (whose ``encode`` returns an ``Encoding``:
    ``genlm smc`` and the kit's vocabulary check failed with "'tokenizers.Encoding' object
    is not iterable") and an ``encode(text)``-only tokenizer."""
    from pathlib import Path

    from genlm.core.cli import encode_text

    path = Path(__file__).parents[1] / "fixtures" / "tokenizers" / "gpt2"
    tokenizers = pytest.importorskip("tokenizers")
    raw = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    expected = raw.encode("Hello world", add_special_tokens=False).ids
    if form == "transformers":
        tokenizer = pytest.importorskip("transformers").AutoTokenizer.from_pretrained(path)
    elif form == "text-only":
        tokenizer = type("TextOnly", (), {"encode": lambda self, text: raw.encode(text).ids})()
    else:
        tokenizer = raw
    assert encode_text(tokenizer, "Hello world") == expected == [15496, 995]


def test_smc_encodes_its_prompt_with_a_tokenizers_tokenizer(capsys, monkeypatch, fresh_registry):
    """A model whose tokenizer is a raw ``tokenizers.Tokenizer`` (its ``encode`` returns an
    ``Encoding``) runs ``genlm smc``, its prompt the tokenizer's own ids; the command
    failed with "'tokenizers.Encoding' object is not iterable" (``genlm bytes`` read it)."""
    from pathlib import Path

    from genlm.core import Vocabulary
    from genlm.core.cli._smc import encode_prompt
    from genlm.core.mock import MockLM

    tokenizers = pytest.importorskip("tokenizers")
    path = Path(__file__).parents[1] / "fixtures" / "tokenizers" / "gpt2" / "tokenizer.json"
    raw = tokenizers.Tokenizer.from_file(str(path))
    vocab = Vocabulary.from_tokenizer(raw)
    monkeypatch.setattr(
        MockLM, "from_name", staticmethod(lambda name, **o: MockLM(vocab, tokenizer=raw, **o))
    )
    argv = ["smc", "Hello world", "--backend", "mock", "--particles", "2", "--max-tokens", "2"]
    assert main([*argv, "--no-progress"]) == 0
    assert "posterior over" in capsys.readouterr().out
    lm = MockLM(vocab, tokenizer=raw)
    assert encode_prompt(lm, "Hello world") == raw.encode("Hello world").ids == [15496, 995]
    lm.close()


#: A `genlm` command whose mock model loads for up to a minute (a big checkpoint, a
#: download), busy in Python without an await; {argv} is the command's arguments.
SLOW_LOAD = r"""
import signal, sys, time
# Python's own Ctrl-C, even when the test run was started with SIGINT ignored (a shell's
# background job), which the child would inherit.
signal.signal(signal.SIGINT, signal.default_int_handler)
from genlm.core.cli import main
from genlm.core.mock import MockLM

def slow_load(model, **opts):
    sys.stdout.write("loading\n")  # one write: a SIGINT cannot fall before its newline
    sys.stdout.flush()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sum(range(1000))
    print("the load was not interrupted", flush=True)
    raise SystemExit(99)

MockLM.from_name = staticmethod(slow_load)
status = main({argv})
print("status", status, flush=True)
sys.exit(status)
"""


@pytest.mark.parametrize("command", [["smc", "hi"], ["bytes", "hi"]])
def test_ctrl_c_during_the_load_stops_the_command_at_once(command):
    """A Ctrl-C while the model loads ends the command with 130 at once, as a separate
    process sent SIGINT mid-load. The load ran inside the command's coroutine, where
    asyncio.run's SIGINT handler only cancels the task: the Ctrl-C waited for the whole
    load."""
    from support.child import run_program

    if command[0] == "bytes":
        pytest.importorskip("genlm.bytes")
    argv = [*command, "--backend", "mock", "--no-progress"]
    ended = run_program(SLOW_LOAD.format(argv=argv), interrupt_after="loading", timeout_s=120)
    assert ended.lines == ["loading", "status 130"], ended.stderr
    assert ended.returncode == 130
