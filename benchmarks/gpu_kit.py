"""The device kit: what the GPU machine lacks for ``gpu_bench.py``, carried in parts.

The GPU machine (the ``run`` tool) reaches no package index, takes at most 64 MiB per
call (the working tree included) and keeps what was carried only while it stays warm. A
session has 15 minutes of device time in all, starts and transfers included, so the kit
carries only what the machine lacks, in as few calls as fit. The machine has Python 3.12,
torch 2.11.0+cu130, transformers, numpy, numba, pandas, matplotlib, pytest and more
(:data:`DEVICE_PACKAGES`), and no vLLM and no pydantic. vLLM 0.26.0's CUDA wheel matches
that torch exactly (it pins torch==2.11.0 and links libcudart.so.13) and is what
genlm-backend 0.3.1's ``[vllm]`` extra pins, so both sides run on the same wheel.

``prepare`` (here, with an index; by hand only, never in CI) fills git-ignored folders
``.gpu-wheels-1`` ... ``.gpu-wheels-N`` at the repository root, one per carrying call:

* ``.gpu-wheels-1``: ``kit.json`` (every folder, the wheel's parts and sha256), vLLM's
  dependencies the machine lacks (``deps/``: :data:`VLLM_DEPS`, found by :func:`probe`,
  and pydantic, with everything they need, less :data:`DEVICE_PACKAGES`), the reference
  (``ref/``: genlm-backend 0.3.1, genlm-bytes 0.2.0, arsenal and what the machine lacks of
  its imports), the llama3.2 tokenizer, and the first part of the vLLM wheel;
* ``.gpu-wheels-2`` ...: the rest of the vLLM wheel, without :data:`SLIM_DROP`;

and writes the exact sequence of device calls to ``benchmarks/gpu_calls.md``. Every
folder carries a ``SHA256SUMS``. There, ``check --expect K`` (each carrying call) verifies
that folders 1..K are present and intact; ``prime`` (call 1) installs the dependencies,
the reference and ours (this checkout, built there: genlm-core compiles its C kernel for
the machine's Python) and imports each against the machine's own packages before
anything else runs; ``install`` (the last carrying call) verifies every folder,
reassembles the wheel, checks its sha256, installs it and imports vLLM's modules. Each
goes into its own ``--target`` folder under ``benchmarks/_work/gpu``: ``vllm``,
``vllm-deps``, ``ours``, ``ref``.

    python benchmarks/gpu_kit.py probe            # here: which imports vLLM 0.26 needs
    python benchmarks/gpu_kit.py prepare          # here: download, split, write the calls
    python benchmarks/gpu_kit.py reference        # here: only the reference (a CPU smoke run)
    python3 benchmarks/gpu_kit.py check --expect K  # there, in carrying call K
    python3 benchmarks/gpu_kit.py prime           # there, in call 1
    python3 benchmarks/gpu_kit.py install         # there, in the last carrying call
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / "_work" / "gpu"
#: Where the split wheels are reassembled on the device.
WHEELS = WORK / "wheels"
CALLS = HERE / "gpu_calls.md"
logger = logging.getLogger("gpu_kit")

#: The vLLM release that matches the machine's torch 2.11.0+cu130, and its wheel's tags.
VLLM = "vllm==0.26.0"
DEVICE_PYTHON = "3.12"
#: The device runs glibc 2.39 (Ubuntu 24.04); some of vLLM's dependencies (llguidance 1.7)
#: only ship manylinux_2_34 wheels.
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(39, 16, -1)),
    "manylinux2014_x86_64",
    "linux_x86_64",
)
#: What one device call may carry (working tree included), and what we leave for the tree
#: and for rounding.
CARRY_LIMIT = 64 * 2**20
CARRY_MARGIN = 4 * 2**20

#: What vLLM 0.26.0 imports for ``LLM(...)`` in-process (engine core, uniproc executor, GPU
#: worker and model runners, FlashAttention, Llama, sampler, logits processors, LoRA,
#: structured output, compilation) beyond the machine's own packages: found by :func:`probe`
#: on 2026-11-24 in a Python 3.11 venv holding only torch, transformers (and what it pulls:
#: pydantic, httpx, anyio, ...), numpy, tokenizers, safetensors, sentencepiece, tiktoken and
#: huggingface_hub. Installed with --no-deps at the versions pip's resolver picks for vLLM
#: 0.26.0 (:func:`resolve`). Runtime-only imports (flashinfer, CUDA graph capture) show up
#: only on the device; vLLM falls back to PyTorch sampling without flashinfer.
VLLM_DEPS = (
    *("aiohappyeyeballs", "aiohttp", "aiosignal", "apache-tvm-ffi", "attrs", "cachetools"),
    *("cbor2", "cloudpickle", "einops", "fastapi", "frozenlist", "llguidance", "msgspec"),
    *("multidict", "openai-harmony", "openai", "partial-json-parser", "pillow"),
    *("prometheus-client", "propcache", "psutil", "py-cpuinfo", "pybase64", "pyzmq"),
    *("sniffio", "starlette", "uvloop", "xgrammar", "yarl"),
)
#: What the probe's venv held that vLLM imports and the device lacks (its venv had it
#: through transformers' extras; ``vllm.config`` is pydantic dataclasses).
VLLM_ALSO = ("pydantic",)
#: The Python distributions the device image holds (the device's KINDS.md, "Python
#: packages already there", read 2026-11-17): never carried. Versions are the image's;
#: ``prime`` imports what the kit installs against them before anything else runs.
DEVICE_PACKAGES = frozenset(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio
    attrs botorch build certifi charset-normalizer chex click cloudpickle cmake colorama
    contourpy coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x
    cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax
    fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
    huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax
    jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader
    lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
    markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
    multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
    numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
    nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
    nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
    nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
    packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
    pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests
    rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
    sentencepiece sentence-transformers setuptools shellingham simplejson six
    sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server
    tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
    torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
    typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
    xarray xxhash yarl zipp""".split()
)
#: Left out of the carried vLLM wheel (``slim_wheel``), by what the wheel's own code
#: says: FlashAttention 2's kernels (123 MiB of the 290; an H100 runs FA3, and
#: ``vllm_flash_attn`` imports FA2 under ``try``) and the Rust API-server binary (only
#: ``VLLM_RUST_FRONTEND_PATH`` runs it; both sides run vLLM in-process).
SLIM_DROP = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs")
#: The modules :func:`probe` imports: what an in-process engine and both sides touch.
PROBE_MODULES = (
    "vllm.entrypoints.llm",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.engine.core",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.gpu.model_runner",  # the reference's MRv2 hook
    "vllm.v1.worker.gpu.sample.output",
    "vllm.v1.core.sched.async_scheduler",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.model_executor.models.llama",
    "vllm.v1.sample.sampler",
    "vllm.v1.sample.logits_processor",
    "vllm.lora.request",
    "vllm.v1.structured_output",
    "vllm.distributed.parallel_state",
    "vllm.compilation.backends",
)
#: Import names whose distribution is named otherwise.
DISTRIBUTIONS = {
    "zmq": "pyzmq",
    "PIL": "pillow",
    "cpuinfo": "py-cpuinfo",
    "yaml": "pyyaml",
    "google": "protobuf",
    "tvm_ffi": "apache-tvm-ffi",
    "opentelemetry": "opentelemetry-api",
    "cv2": "opencv-python-headless",
    "attr": "attrs",
    "dateutil": "python-dateutil",
}

#: The reference: installed with --no-deps; what arsenal imports comes as wheels.
REFERENCE = ("genlm-backend==0.3.1", "genlm-bytes==0.2.0", "arsenal")
#: What arsenal imports (IPython; matplotlib, for arsenal.timer), with their dependencies.
REFERENCE_HELPERS = ("ipython", "matplotlib")
#: Heavier imports of the reference (its trie needs numba), at the versions the nox
#: ``clients`` session runs it with: for a CPU smoke run only (``reference``); the device
#: has its own numba, llvmlite and pandas.
REFERENCE_HEAVY = ("numba==0.68.1", "llvmlite==0.50.0", "pandas")
#: Never installed into a side's folder: the machine's own builds are used.
MACHINE_PACKAGES = ("numpy", "torch", "scipy", "transformers", "triton")


def folder(name: str) -> Path:
    return REPO / name


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_sums(path: Path) -> None:
    """``SHA256SUMS`` of every file in ``path`` (recursively), as ``sha256sum`` writes it."""
    files = sorted(f for f in path.rglob("*") if f.is_file() and f.name != "SHA256SUMS")
    lines = [f"{sha256(f)}  {f.relative_to(path)}" for f in files]
    (path / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def verify_sums(path: Path) -> list[str]:
    """What is wrong with ``path`` against its ``SHA256SUMS`` (empty: intact)."""
    sums = path / "SHA256SUMS"
    if not sums.exists():
        return [f"{path.name}: no SHA256SUMS"]
    problems = []
    for line in sums.read_text().splitlines():
        digest, name = line.split("  ", 1)
        file = path / name
        if not file.exists():
            problems.append(f"{path.name}/{name}: missing")
        elif sha256(file) != digest:
            problems.append(f"{path.name}/{name}: sha256 differs (damaged in transit)")
    return problems


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def tree_bytes() -> int:
    """Bytes of the working tree a device call copies (tracked and untracked, not ignored)."""
    out = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    )
    names = [n for n in out.stdout.decode().split("\0") if n]
    return sum((REPO / n).stat().st_size for n in names if (REPO / n).is_file())


def pip_download(dest: Path, *args: str, python: str = DEVICE_PYTHON) -> None:
    """``pip download`` of wheels for the device's Python (or ``python``) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--dest", str(dest)]
    cmd += wheel_tags(python)
    subprocess.run([*cmd, *args], check=True)


def wheel_tags(python: str = DEVICE_PYTHON) -> list[str]:
    tags = ["--only-binary=:all:", "--python-version", python]
    for tag in PLATFORMS:
        tags += ["--platform", tag]
    return tags


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---- probe: which imports vLLM needs (here) ----------------------------------------------


#: Imports each module in turn in one process; prints ``{module: error or null}``.
_PROBE_SCRIPT = """
import importlib, json, sys
errors = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        errors[name] = None
    except Exception as e:
        errors[name] = f"{type(e).__name__}: {e}"
print(json.dumps(errors))
"""


def probe(args: argparse.Namespace) -> None:
    """Install vLLM with --no-deps into a scratch folder, import :data:`PROBE_MODULES`, and
    add each missing module's distribution (at the resolver's version) until all import.

    Each round imports every module in one process and adds what any of them missed, so
    dependency chains (aiohttp, then multidict, then yarl) take one round per link.
    ``--seed`` installs :data:`VLLM_DEPS` first (to re-check a known set in one round).
    ``--python`` should be an interpreter holding only what the device has (torch,
    transformers, numpy, tokenizers, ...). The CUDA wheel's compiled ops cannot load on a
    CPU; errors other than a missing module are reported, not chased.
    """
    versions = resolve(kit_cache())
    scratch = Path(tempfile.mkdtemp(prefix="vllm-probe-"))
    target = scratch / "site"
    pip = [args.python, "-m", "pip", "install", "-q", "--no-deps", "--upgrade"]
    pip += ["--target", str(target)]

    def pinned(name: str) -> str:
        name = canonical(name)
        return f"{name}=={versions[name]}" if name in versions else name

    added = [pinned(d) for d in VLLM_DEPS] if args.seed else []
    subprocess.run([*pip, str(vllm_wheel()), *added], check=True)
    env = dict(os.environ, PYTHONPATH=str(target))
    while True:
        out = subprocess.run(
            [args.python, "-c", _PROBE_SCRIPT, *PROBE_MODULES],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        errors = json.loads(out.stdout.strip().splitlines()[-1])
        missing = {
            m.group(1).split(".")[0]
            for e in errors.values()
            if e
            and (m := re.search(r"No module named '([\w.]+)'", e))
            and not m.group(1).startswith("vllm")
        }
        new = sorted({pinned(DISTRIBUTIONS.get(top, top)) for top in missing} - set(added))
        if not new:
            break
        logger.info("missing %s: adding %s", ", ".join(sorted(missing)), ", ".join(new))
        subprocess.run([*pip, *new], check=True)
        added += new
    for module, error in errors.items():
        logger.info("%s: %s", module, error or "imports")
    print(json.dumps(sorted(added), indent=1))
    shutil.rmtree(scratch)


# ---- prepare (here) ---------------------------------------------------------------------

#: The kit's folders at the repository root, ``.gpu-wheels-1`` ... ``.gpu-wheels-N``: what
#: one carrying call each takes (``.gitignore`` ignores ``/.gpu-wheels*/``).
KIT = ".gpu-wheels"
#: In the first folder: the kit's manifest (every folder, the split wheel), vLLM's
#: dependencies the device lacks, the reference's wheels and the llama3.2 tokenizer.
MANIFEST, DEPS, REF, TOKENIZER = "kit.json", "deps", "ref", "llama3.2"
#: Room kept in the first folder for the manifest and the folder's ``SHA256SUMS``.
MANIFEST_ROOM = 64 * 2**10


def kit_folder(number: int) -> Path:
    return folder(f"{KIT}-{number}")


def prepare(args: argparse.Namespace) -> None:
    """Download what the device lacks, pack it into as few carrying calls as fit (the
    first folder filled up with the vLLM wheel's first part), and write the calls."""
    budget = CARRY_LIMIT - tree_bytes() - CARRY_MARGIN
    for old in kit_folders():
        shutil.rmtree(old)
    first = kit_folder(1)
    fresh(first)
    report = resolved(kit_cache())
    missing = missing_on_device(report)
    pip_download(first / DEPS, "--no-deps", *(f"{n}=={report[n]['version']}" for n in missing))
    prepare_reference(first, args.heavy, on_device=DEVICE_PACKAGES)
    room = budget - size_of(first) - MANIFEST_ROOM
    split = split_wheel(slim_wheel(vllm_wheel()), room, budget)
    write_manifest(split)
    write_calls(split, budget)


def resolved(cache: Path) -> dict[str, dict]:
    """Every distribution pip would install with vLLM on the device, ``name -> {"version",
    "requires"}`` (``requires``: the names it needs on the device, extras left out), from a
    dry run of its resolver; cached in ``cache``.

    vLLM's own pins alone are not enough: the newest xgrammar they admit needs a newer
    apache-tvm-ffi than the one they pin; the resolver picks versions that fit together.
    """
    from packaging.requirements import Requirement

    report = cache / "resolved.json"
    if not report.exists():
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed"]
        cmd += ["--report", str(report), "--target", str(cache / "dry-run"), *wheel_tags()]
        subprocess.run([*cmd, VLLM], check=True)
    device = {"python_version": DEVICE_PYTHON, "python_full_version": f"{DEVICE_PYTHON}.3"}
    device |= {"sys_platform": "linux", "platform_system": "Linux", "extra": ""}
    device |= {"platform_machine": "x86_64", "implementation_name": "cpython"}
    out = {}
    for item in json.loads(report.read_text())["install"]:
        requires = [Requirement(r) for r in item["metadata"].get("requires_dist", [])]
        out[canonical(item["metadata"]["name"])] = {
            "version": item["metadata"]["version"],
            "requires": [
                canonical(r.name) for r in requires if not r.marker or r.marker.evaluate(device)
            ],
        }
    return out


def resolve(cache: Path) -> dict[str, str]:
    """The version of every distribution pip would install with vLLM on the device."""
    return {name: item["version"] for name, item in resolved(cache).items()}


def missing_on_device(report: dict[str, dict]) -> list[str]:
    """What vLLM's in-process imports (:data:`VLLM_DEPS`, :data:`VLLM_ALSO`) need, with
    everything those need in turn, less what the device has (:data:`DEVICE_PACKAGES`,
    whose own needs the device meets)."""
    needed: list[str] = []
    todo = [canonical(n) for n in (*VLLM_DEPS, *VLLM_ALSO)]
    while todo:
        name = todo.pop()
        if name in needed or name in DEVICE_PACKAGES or name in MACHINE_PACKAGES:
            continue
        if name not in report:
            raise KeyError(f"{name}: not among the distributions pip resolves for {VLLM}")
        needed.append(name)
        todo += [r for r in report[name]["requires"] if r != "vllm"]
    return sorted(needed)


def kit_cache() -> Path:
    """Where downloads are kept between ``prepare`` runs (git-ignored)."""
    cache = WORK.parent / "kit-cache"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def vllm_wheel() -> Path:
    """vLLM's CUDA wheel, downloaded once into the kit cache."""
    cache = kit_cache()
    if not list(cache.glob("vllm-*.whl")):
        pip_download(cache, "--no-deps", VLLM)
    return next(cache.glob("vllm-*.whl"))


def slim_wheel(wheel: Path) -> Path:
    """``wheel`` without :data:`SLIM_DROP` (and their ``RECORD`` lines), once, in the kit
    cache: what the device needs of it, in fewer carrying calls."""
    slim = kit_cache() / "slim" / wheel.name
    if slim.exists():
        return slim
    slim.parent.mkdir(exist_ok=True)
    scratch = slim.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(scratch, "w") as dst:
        for info in src.infolist():
            if info.filename in SLIM_DROP:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(x for x in lines if x.split(",")[0] not in SLIM_DROP).encode()
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    scratch.replace(slim)
    logger.info("%s: %d bytes without %s", slim.name, slim.stat().st_size, ", ".join(SLIM_DROP))
    return slim


def fresh(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()


def split_wheel(wheel: Path, first: int, budget: int) -> dict:
    """Split ``wheel`` into parts: ``first`` bytes in the first kit folder (beside what it
    already holds), then at most ``budget`` bytes in each further folder; returns the
    manifest's entry for it."""
    if first <= 0:
        raise ValueError(f"no room for {wheel.name} in {KIT}-1 ({first} bytes): carry less")
    size = wheel.stat().st_size
    sizes = [min(first, size)]
    while sum(sizes) < size:
        sizes.append(min(budget, size - sum(sizes)))
    folders = []
    with wheel.open("rb") as f:
        for number, part in enumerate(sizes, 1):
            path = kit_folder(number)
            if number > 1:
                fresh(path)
            (path / f"{wheel.name}.part{number}").write_bytes(f.read(part))
            folders.append(path.name)
    logger.info("%s: %d bytes in %d parts", wheel.name, size, len(sizes))
    return {"wheel": wheel.name, "sha256": sha256(wheel), "bytes": size, "parts": folders}


def write_manifest(split: dict | None) -> None:
    """``kit.json`` in the first folder (every kit folder, the split wheel, if any), and
    every folder's ``SHA256SUMS``."""
    folders = split["parts"] if split else [kit_folder(1).name]
    manifest = {"folders": folders, "split": split}
    (kit_folder(1) / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    for name in folders:
        write_sums(folder(name))


def reference(args: argparse.Namespace) -> None:
    """Only the reference's folder, for ``--python-version`` (a CPU smoke run here): the
    first kit folder with the reference's wheels (its heavy imports too) and the tokenizer."""
    first = kit_folder(1)
    fresh(first)
    prepare_reference(first, args.heavy, args.python_version)
    write_manifest(None)


def prepare_reference(
    dest: Path, heavy: bool, python: str = DEVICE_PYTHON, on_device: frozenset = frozenset()
) -> None:
    """The reference's wheels (with ``heavy``, its heavy imports too) in ``dest/ref``, less
    what the machine has (``on_device``); the llama3.2 tokenizer's files in
    ``dest/llama3.2``."""
    wheels = dest / REF
    pip_download(wheels, "--no-deps", *REFERENCE, python=python)
    pip_download(wheels, *REFERENCE_HELPERS, python=python)
    for requirement in REFERENCE_HEAVY if heavy else ():
        deps = [] if requirement.startswith("pandas") else ["--no-deps"]
        pip_download(wheels, *deps, requirement, python=python)
    for wheel in wheels.glob("*.whl"):
        if canonical(wheel.name.split("-")[0]) in {*MACHINE_PACKAGES, *on_device}:
            wheel.unlink()
    (dest / TOKENIZER).mkdir()
    for f in tokenizer_source().iterdir():  # what AutoTokenizer reads; not source/
        if f.is_file():
            shutil.copy(f, dest / TOKENIZER / f.name)


def tokenizer_source() -> Path:
    """The llama3.2 tokenizer in ``../shared`` (Meta licence: carried, never committed)."""
    for d in REPO.parents:
        path = d / "shared" / "models" / "tokenizers" / "llama3.2"
        if path.is_dir():
            return path
    raise FileNotFoundError("no shared/models/tokenizers/llama3.2 above this checkout")


def write_calls(split: dict, budget: int) -> None:
    """The device calls, in order, with what each carries and its time limit:
    ``benchmarks/gpu_calls.md``."""
    folders = split["parts"]
    calls = []
    for number, name in enumerate(folders, 1):
        command = f"python3 benchmarks/gpu_kit.py check --expect {number}"
        limit = 60
        if number == 1:
            command += " && python3 benchmarks/gpu_kit.py prime"
            limit = PRIME_LIMIT
        if number == len(folders):
            command += f" && {INSTALL_AND_RUN}"
            limit = INSTALL_LIMIT
        calls.append(([name], command, limit))
    calls += [([], command, limit) for command, limit in RUN_CALLS]
    lines = [CALLS_HEAD, "| # | carry | timeout_s | command |", "| --- | --- | --- | --- |"]
    for number, (carry, command, limit) in enumerate(calls, 1):
        size = sum(size_of(folder(c)) for c in carry) / 2**20
        note = ", ".join(f'"{c}"' for c in carry)
        note = f"[{note}] ({size:.1f} MiB)" if carry else "[]"
        lines.append(f"| {number} | {note} | {limit} | `{command}` |")
    lines += ["", CALLS_NOTE, "What travels (sha256s in each folder's `SHA256SUMS`):", ""]
    first = kit_folder(1)
    for name in folders:
        lines.append(f"* `{name}`: {size_of(folder(name)) / 2**20:.1f} MiB")
    lines += [
        "",
        f"In `{first.name}`: vLLM's dependencies the device lacks (`{DEPS}/`, from the "
        "resolver's closure of the probe's list, less the device's packages), the "
        f"reference's wheels (`{REF}/`), the llama3.2 tokenizer (`{TOKENIZER}/`) and the "
        "first part of the vLLM wheel:",
        "",
    ]
    for sub in (DEPS, REF):
        for wheel in sorted((first / sub).glob("*.whl"), key=lambda w: -w.stat().st_size):
            lines.append(f"* `{sub}/{wheel.name}`: {wheel.stat().st_size / 2**20:.2f} MiB")
    lines += [
        "",
        f"The vLLM wheel, without {', '.join(f'`{d}`' for d in SLIM_DROP)}: "
        f"`{split['wheel']}`, {split['bytes']:,} bytes in {len(folders)} parts, sha256 "
        f"`{split['sha256']}` (`install` reassembles and checks it).",
        f"Each call may carry {budget / 2**20:.1f} MiB (64 MiB less the working tree and "
        f"{CARRY_MARGIN / 2**20:.0f} MiB spare).",
    ]
    CALLS.write_text("\n".join(lines) + "\n")
    logger.info("wrote %s", CALLS)


#: The last carrying call's work after ``check``: install vLLM and both sides (``install``
#: checks that vLLM's modules import), then the whole ``tests/vllm`` on CUDA. The second
#: device session (H200, 2026-11-28) measured ours with ``sessions=True``; its tests ran 78
#: of 118 tests in 250 s, and the 17 failures seen were TF32 in vLLM's Triton attention
#: (the test session now sets ``TRITON_F32_DEFAULT=ieee``). So vLLM 0.26.0 on CUDA is
#: verified only once the whole session passes: that comes first now.
INSTALL_AND_RUN = (
    "python3 benchmarks/gpu_kit.py install && python3 benchmarks/gpu_bench.py tests "
    "tests/vllm --side-timeout 400 --out $OUT"
)
PRIME_LIMIT, INSTALL_LIMIT = 240, 480
#: The calls after the carrying ones, most valuable next, each with a worker timeout below
#: the call's limit (results are written out after each side and come back in $OUT even
#: when a call is cut off). Times seen on the H200, 2026-11-28 (two sessions): the
#: machine's start and call 1, 84-90 s; calls 2 and 3, 6-13 s; ``install``, about 60 s; a
#: vLLM run of both sides, 185-250 s (each engine's start with torch.compile and CUDA
#: graphs, then the loads); the CUDA tests of ``tests/vllm``, 78 tests in 250 s; an hf
#: side, 50-90 s. The hf comparison (last measured in the first session) comes after the
#: tests.
RUN_CALLS = (
    (
        "python3 benchmarks/gpu_bench.py run --device cuda --backend hf --shape 1B "
        "--side-timeout 110 --out $OUT",
        240,
    ),
)
CALLS_HEAD = """\
# Device calls for the GPU benchmark (written by `benchmarks/gpu_kit.py prepare`)

A session has 15 minutes (900 s) of device time in all: the machine's start (a minute or
two), every transfer, every command, every idle wait and the close count. Make these `run`
calls back to back, each at once after the last returns (the machine goes back after
30 s idle, and the carried folders with it: a `check --expect N` that finds an earlier
folder missing says so; start again from call 1). Every call runs from the repository
root. Stop at the first call that exits non-zero: its output says what failed. Before
each measuring call, read `status`: give that call `timeout_s` of at most
`budget_left_s` less 30 (and `--side-timeout` under half of that), or leave it for a
later session; call `give_back` after the last call.
"""
#: Said under the calls.
CALLS_NOTE = """\
Not in this plan (a later session's work, the same calls with other options): the vLLM
comparison (`gpu_bench.py run --device cuda --backend vllm --shape 1B`, with `--sessions`
for ours with sessions; both measured on 2026-11-28, `results/gpu.md`), the 8B shape
(`--shape 8B`), 1B at P=64 on its own (`run` measures it after P=16, the profile and
the byte LM, when the side's time allows), and a rerun of what failed. Each (side,
backend)'s results file keeps the rows another run did not measure again, but lives on
the machine only while it is warm: `$OUT` holds everything measured so far after each side
(`gpu_table.md`: the table and the profiles; `gpu_results.json`: every result; `tests.log`).
Paste the table (and the profile summaries where a target is missed) into
`benchmarks/results/gpu.md` under a dated heading naming the GPU.
"""


# ---- check and install (there) ----------------------------------------------------------


def kit_folders() -> list[Path]:
    return sorted(p for p in REPO.glob(f"{KIT}*") if p.is_dir())


def manifest() -> dict:
    """The kit's manifest, from the first folder; a clear error where it has not arrived."""
    path = kit_folder(1) / MANIFEST
    if not path.is_file():
        present = ", ".join(p.name for p in kit_folders()) or "none"
        raise SystemExit(
            f"{path.relative_to(REPO)} is missing (kit folders here: {present}): carry "
            f"{KIT}-1 first (call 1 of benchmarks/gpu_calls.md), or run `prepare` or "
            "`reference` here"
        )
    return json.loads(path.read_text())


def kit_problems(expect: int) -> list[str]:
    """What is wrong with the kit: each of the first ``expect`` folders of the manifest
    must be here, and every folder here must match its ``SHA256SUMS``."""
    folders = manifest()["folders"]
    if expect > len(folders):
        return [f"--expect {expect}, but the kit has {len(folders)} folders"]
    problems = []
    for number, name in enumerate(folders, 1):
        path = folder(name)
        if path.is_dir():
            found = verify_sums(path)
            problems += found
            logger.info("%s: %s", name, "damaged" if found else f"intact, {size_of(path):,} B")
        elif number <= expect:
            problems.append(
                f"{name}: missing (carried by call {number}; if it was carried, the machine "
                "went back since and took it: start again from call 1)"
            )
        else:
            logger.info("%s: still to come (call %d)", name, number)
    return problems


def check(args: argparse.Namespace) -> None:
    """Verify the kit after a carrying call: the first ``--expect`` folders present and
    intact, and any other folder here intact."""
    problems = kit_problems(args.expect)
    if problems:
        raise SystemExit("the kit is incomplete or damaged:\n" + "\n".join(problems))


def prime(args: argparse.Namespace) -> None:
    """Install what the first folder brings (vLLM's dependencies, the reference) and ours,
    and check that each imports here, against this machine's own packages, before
    anything else runs."""
    python = args.python or sys.executable
    first = kit_folder(1)
    targets = {}
    if (first / DEPS).is_dir():
        targets["vllm-deps"] = install_folder(python, "vllm-deps", sorted((first / DEPS).glob("*")))
    targets |= install_sides(python)
    failed = {}
    for name, target in targets.items():
        modules = [top_level(target)] if name == "vllm-deps" else [SIDE_IMPORTS[name]]
        failed |= import_errors(python, [target], [m for ms in modules for m in ms])
    if failed:
        raise SystemExit(
            "does not import here:\n" + "\n".join(f"{m}: {e}" for m, e in failed.items())
        )
    logger.info("every carried package imports: %s", ", ".join(targets))


#: What each side's folder must import (the reference: both releases, checked to be them).
SIDE_IMPORTS = {
    "ours": ["genlm.core._trie_kernel", "genlm.backends.hf", "genlm.bytes"],
    "ref": ["genlm.backend.llm", "genlm.bytes.trie", "numba", "_common"],
}


def top_level(target: Path) -> list[str]:
    """The importable top-level modules installed in ``target``."""
    names = []
    for path in sorted(target.iterdir()):
        if path.name.endswith((".dist-info", ".data")) or path.name in ("bin", "__pycache__"):
            continue
        if path.is_dir() and (path / "__init__.py").exists():
            names.append(path.name)
        elif path.suffix == ".py" or path.name.endswith(".so"):
            names.append(path.name.split(".")[0])
    return names


def import_errors(python: str, paths: list[Path], modules: list[str]) -> dict[str, str]:
    """``module -> error`` for each of ``modules`` that fails to import with ``paths`` (and
    this folder, for ``_common``) on ``PYTHONPATH``; with ``_common`` among them, also
    whether the reference is genlm-backend 0.3.1 / genlm-bytes 0.2.0 from their files."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, [*paths, HERE])))
    script = _PROBE_SCRIPT
    if "_common" in modules:  # the reference: also that it is 0.3.1 / 0.2.0, from its files
        script += "import _common; _common.require_reference()\n"
    out = subprocess.run(
        [python, "-c", script, *modules], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        return {" ".join(modules): out.stderr.strip().splitlines()[-1]}
    errors = json.loads(out.stdout.strip().splitlines()[0])
    return {m: e for m, e in errors.items() if e}


def install(args: argparse.Namespace) -> None:
    """Verify every folder, reassemble and check the vLLM wheel, install it (and prime's
    folders, reused), and check that vLLM's modules import."""
    kit = manifest()
    problems = kit_problems(len(kit["folders"]))
    if problems:
        raise SystemExit("the kit is incomplete or damaged:\n" + "\n".join(problems))
    split = kit["split"]
    if split is None:
        raise SystemExit(f"{KIT}-1 holds the reference only (`reference`): no vLLM to install")
    prime(args)
    WHEELS.mkdir(parents=True, exist_ok=True)
    wheel = WHEELS / split["wheel"]
    with wheel.open("wb") as out:
        for number, name in enumerate(split["parts"], 1):
            with (folder(name) / f"{split['wheel']}.part{number}").open("rb") as part:
                shutil.copyfileobj(part, out)
    if sha256(wheel) != split["sha256"]:
        raise SystemExit(f"{wheel.name}: the reassembled wheel's sha256 differs")
    logger.info("%s reassembled, sha256 matches", wheel.name)
    python = args.python or sys.executable
    target = install_folder(python, "vllm", [wheel])
    errors = import_errors(python, [target, WORK / "vllm-deps"], list(PROBE_MODULES))
    if errors:
        raise SystemExit(
            "vLLM does not import here:\n" + "\n".join(f"{m}: {e}" for m, e in errors.items())
        )
    logger.info("vLLM %s: every probed module imports", split["wheel"].split("-")[1])


def install_folder(python: str, name: str, sources: list, *, build: bool = False) -> Path:
    """``pip install --no-deps --no-index --target benchmarks/_work/gpu/NAME`` of wheels, or
    of source trees with ``build`` (built with the interpreter's own setuptools); skipped
    when unchanged.

    A folder is reused when what it was installed from is unchanged (a stamp of the
    sources' names, and for source trees every file's content).
    """
    target = WORK / name
    stamp = hashlib.sha256(python.encode())
    for source in map(Path, sources):
        files = sorted(f for f in source.rglob("*") if f.is_file()) if source.is_dir() else []
        stamp.update(str(source).encode())
        for f in files:
            # Not what the in-tree build writes (build/, src/*.egg-info): the next call
            # would see a changed tree and build ours again.
            skip = {"__pycache__", "build"}.intersection(f.parts) or any(
                part.endswith(".egg-info") for part in f.parts
            )
            if not skip:
                stamp.update(str(f).encode() + f.read_bytes())
    marker = target / ".installed-from"
    if marker.exists() and marker.read_text() == stamp.hexdigest():
        logger.info("%s: reusing %s", name, target)
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    cmd = [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-warn-conflicts"]
    cmd += ["--no-compile"]  # no .pyc for vLLM's thousands of modules: seconds of the call
    cmd += ["--no-index"] + (["--no-build-isolation"] if build else [])
    logger.info("%s: installing into %s", name, target)
    # Into a folder of our own, never the system's site-packages; a system Python marked
    # externally managed (PEP 668) would otherwise refuse.
    env = dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1")
    subprocess.run([*cmd, "--target", str(target), *map(str, sources)], check=True, env=env)
    marker.write_text(stamp.hexdigest())
    return target


#: Our distributions, built from this checkout into the ``ours`` folder.
OURS = ("genlm-core", "genlm-backend-hf", "genlm-bytes", "genlm-backend-vllm")


def install_ours(python: str) -> Path:
    """Build and install this checkout into the ``ours`` folder."""
    return install_folder(python, "ours", [REPO / d for d in OURS], build=True)


def install_sides(python: str) -> dict[str, Path]:
    """Install ours (this checkout) and the reference (the first kit folder's wheels) into
    their folders."""
    wheels = sorted((kit_folder(1) / REF).glob("*.whl"))
    if not any(w.name.startswith("genlm_backend-0.3.1") for w in wheels):
        raise FileNotFoundError(
            f"no genlm_backend-0.3.1 wheel in {KIT}-1/{REF}: carry it (call 1), or run "
            "`prepare` or `reference` here"
        )
    return {"ours": install_ours(python), "ref": install_folder(python, "ref", wheels)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("probe", help="find the imports vLLM needs (here)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--seed", action="store_true", help="start from VLLM_DEPS")
    p = commands.add_parser("prepare", help="download and split the kit (here)")
    p.add_argument("--no-heavy", dest="heavy", action="store_false")
    p = commands.add_parser("reference", help="only the reference's folders (a CPU smoke run)")
    p.add_argument("--python-version", default=f"{sys.version_info[0]}.{sys.version_info[1]}")
    p.add_argument("--no-heavy", dest="heavy", action="store_false")
    p = commands.add_parser("check", help="verify the folders carried so far (there)")
    p.add_argument("--expect", type=int, default=1, help="the folders 1..N must be here")
    for name, text in (
        ("prime", "install what the first folder brings and ours, check they import (there)"),
        ("install", "verify, reassemble, install vLLM, check it imports (there)"),
    ):
        p = commands.add_parser(name, help=text)
        p.add_argument("--python", help="the interpreter to install for (default: this one)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    actions = {"probe": probe, "prepare": prepare, "reference": reference}
    actions |= {"check": check, "prime": prime, "install": install}
    actions[args.command](args)


if __name__ == "__main__":
    main()
