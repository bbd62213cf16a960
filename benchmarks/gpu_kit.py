"""The device kit: what the GPU machine lacks for ``gpu_bench.py``, carried in parts.

The GPU machine (the ``run`` tool) reaches no package index and takes at most 64 MiB of
ignored folders per call, the working tree included. It has Python 3.12, torch
2.11.0+cu130, transformers and numpy, and no vLLM. vLLM 0.26.0's CUDA wheel matches that
torch exactly (it pins torch==2.11.0 and links libcudart.so.13) and is what
genlm-backend 0.3.1's ``[vllm]`` extra pins, so both sides run on the same wheel.

``prepare`` (here, with an index; by hand only, never in CI) downloads into git-ignored
folders at the repository root:

* ``.vllm-1`` ... ``.vllm-N``: the vLLM wheel split into parts that each fit one call;
* ``.vllm-deps``: the wheels an in-process ``LLM(...)`` with logits processors imports
  that the machine lacks (:data:`VLLM_DEPS`, found by :func:`probe`), pytest for the
  test session, and ``kit.json`` (every part's and the whole wheel's sha256);
* ``.gpu-wheels``: the reference (genlm-backend 0.3.1, genlm-bytes 0.2.0) and its small
  imports, and the llama3.2 tokenizer; ``.gpu-wheels-NAME``: its heavy imports (a wheel
  too big for one call, llvmlite, in parts ``.gpu-wheels-llvmlite-1`` ... as vLLM's);

and writes the exact sequence of device calls to ``benchmarks/gpu_calls.md``.
Every folder carries a ``SHA256SUMS``. There, ``check`` verifies the folders that have
arrived, and ``install`` verifies all of them, reassembles the wheel, checks its sha256
and installs each side into its own ``--target`` folder under ``benchmarks/_work/gpu``:
``vllm`` (the wheel and its dependencies), ``ours`` (this checkout, built there: genlm-core
compiles its C kernel for the machine's Python) and ``ref`` (the reference's wheels).

    python benchmarks/gpu_kit.py probe            # here: which imports vLLM 0.26 needs
    python benchmarks/gpu_kit.py prepare          # here: download, split, write the calls
    python3 benchmarks/gpu_kit.py check           # there, after each carrying call
    python3 benchmarks/gpu_kit.py install         # there, once everything has arrived
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
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
#: The test session (``tests/vllm`` on CUDA) needs pytest; the machine may lack it.
TEST_DEPS = ("pytest", "pluggy", "iniconfig", "pytest-timeout")
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
#: Heavier imports of the reference (its trie needs numba), each in its own folder
#: (llvmlite alone is ~57 MiB), at the versions the nox ``clients`` session runs it with
#: (numba 0.68 admits the device's numpy 2.5; vLLM 0.26's own pin, numba 0.65, does not).
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
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--dest", str(dest)]
    cmd += wheel_tags(python)
    subprocess.run([*cmd, *args], check=True)


def resolve(cache: Path) -> dict[str, str]:
    """The version of every distribution pip would install with vLLM on the device
    (``name -> version``), from a dry run of its resolver; cached in ``cache``.

    vLLM's own pins alone are not enough: the newest xgrammar they admit needs a newer
    apache-tvm-ffi than the one they pin; the resolver picks versions that fit together.
    """
    report = cache / "resolved.json"
    if not report.exists():
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed"]
        cmd += ["--report", str(report), "--target", str(cache / "dry-run"), *wheel_tags()]
        subprocess.run([*cmd, VLLM], check=True)
    installs = json.loads(report.read_text())["install"]
    return {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


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


def prepare(args: argparse.Namespace) -> None:
    """Download and split everything the device lacks, and write the call sequence."""
    budget = CARRY_LIMIT - tree_bytes() - CARRY_MARGIN
    for old in [*REPO.glob(".vllm-*"), *REPO.glob(".gpu-wheels*")]:
        shutil.rmtree(old)
    deps = folder(".vllm-deps")
    fresh(deps)
    versions = resolve(kit_cache())
    pip_download(deps, "--no-deps", *(f"{d}=={versions[canonical(d)]}" for d in VLLM_DEPS))
    pip_download(deps, "--no-deps", *TEST_DEPS)
    splits = [split_wheel(vllm_wheel(), ".vllm", budget)]
    reference = prepare_reference(args.heavy)
    for path in reference:  # a wheel too big for one call travels in parts (llvmlite)
        for wheel in list(path.glob("*.whl")):
            if wheel.stat().st_size > budget:
                splits.append(split_wheel(wheel, path.name, budget))
                wheel.unlink()
    for path in [p for p in reference if not any(p.iterdir())]:
        path.rmdir()
        reference.remove(path)
    (deps / "kit.json").write_text(json.dumps({"split": splits}, indent=1) + "\n")
    parts = [folder(name) for split in splits for name in split["parts"]]
    for path in [*parts, deps, *reference]:
        write_sums(path)
    write_calls(parts, deps, reference, budget)


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


def fresh(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()


def split_wheel(wheel: Path, stem: str, budget: int) -> dict:
    """Split ``wheel`` into equal parts of at most ``budget`` bytes, in folders
    ``STEM-1`` ... ``STEM-N``; returns its ``kit.json`` entry."""
    size = wheel.stat().st_size
    count = math.ceil(size / budget)
    part = math.ceil(size / count)
    folders = []
    with wheel.open("rb") as f:
        for i in range(1, count + 1):
            path = folder(f"{stem}-{i}")
            fresh(path)
            (path / f"{wheel.name}.part{i}").write_bytes(f.read(part))
            folders.append(path.name)
    logger.info("%s: %d bytes in %d parts of %d", wheel.name, size, count, part)
    return {"wheel": wheel.name, "sha256": sha256(wheel), "bytes": size, "parts": folders}


def reference(args: argparse.Namespace) -> None:
    """Only the reference's folders, for ``--python-version`` (a CPU smoke run here)."""
    for path in prepare_reference(args.heavy, args.python_version):
        write_sums(path)


def prepare_reference(heavy: bool, python: str = DEVICE_PYTHON) -> list[Path]:
    """The reference's wheels and the llama3.2 tokenizer; with ``heavy``, its heavy imports."""
    wheels = folder(".gpu-wheels")
    fresh(wheels)
    pip_download(wheels, "--no-deps", *REFERENCE, python=python)
    pip_download(wheels, *REFERENCE_HELPERS, python=python)
    shutil.copytree(tokenizer_source(), wheels / "llama3.2")
    folders = [wheels]
    if heavy:
        for requirement in REFERENCE_HEAVY:
            name = requirement.split("==")[0]
            path = folder(f".gpu-wheels-{name}")
            fresh(path)
            deps = [] if name == "pandas" else ["--no-deps"]
            pip_download(path, *deps, requirement, python=python)
            folders.append(path)
    for path in folders:
        for wheel in path.glob("*.whl"):  # the machine has its own builds of these
            if canonical(wheel.name.split("-")[0]) in MACHINE_PACKAGES:
                wheel.unlink()
    return folders


def tokenizer_source() -> Path:
    """The llama3.2 tokenizer in ``../shared`` (Meta licence: carried, never committed)."""
    for d in REPO.parents:
        path = d / "shared" / "models" / "tokenizers" / "llama3.2"
        if path.is_dir():
            return path
    raise FileNotFoundError("no shared/models/tokenizers/llama3.2 above this checkout")


def write_calls(parts: list[Path], deps: Path, reference: list[Path], budget: int) -> None:
    """The device calls, in order, with what each carries: ``benchmarks/gpu_calls.md``."""
    loads = [[p] for p in parts]
    for path in [deps, *reference]:  # small folders share a call while they fit
        if (
            loads
            and loads[-1][0] not in parts
            and sum(map(size_of, loads[-1])) + size_of(path) <= budget
        ):
            loads[-1].append(path)
        else:
            loads.append([path])
    check = "python3 benchmarks/gpu_kit.py check"
    calls = [([p.name for p in load], check, 120) for load in loads]
    calls += [([], c, t) for c, t in RUN_CALLS]
    lines = [
        "# Device calls for the GPU benchmark (written by `benchmarks/gpu_kit.py prepare`)",
        "",
        "Make these `run` calls back to back (the machine keeps carried folders only while",
        "it is warm: it goes back after 30 s idle). Every call runs from the repository",
        "root. If a `check` reports a damaged or missing part, repeat that call.",
        "",
        "| # | carry | timeout_s | command |",
        "| --- | --- | --- | --- |",
    ]
    for i, (carry, command, timeout) in enumerate(calls, 1):
        carried = ", ".join(f'"{c}"' for c in carry)
        size = sum(size_of(folder(c)) for c in carry) / 2**20
        note = f"[{carried}] ({size:.1f} MiB)" if carry else "[]"
        lines.append(f"| {i} | {note} | {timeout} | `{command}` |")
    lines += [
        "",
        CALLS_NOTE,
        "Each wheel part and folder (sha256s in the folder's `SHA256SUMS`):",
        "",
    ]
    for path in [*parts, deps, *reference]:
        lines.append(f"* `{path.name}`: {size_of(path) / 2**20:.1f} MiB")
    lines += ["", "vLLM's dependencies in `.vllm-deps` (what the machine lacks, by the probe):", ""]
    for wheel in sorted(deps.glob("*.whl"), key=lambda w: -w.stat().st_size):
        lines.append(f"* `{wheel.name}`: {wheel.stat().st_size / 2**20:.2f} MiB")
    lines += ["", "Split wheels, reassembled and checked by `install`:", ""]
    for split in json.loads((deps / "kit.json").read_text())["split"]:
        lines.append(
            f"* `{split['wheel']}`, {split['bytes']:,} bytes in {len(split['parts'])} parts, "
            f"sha256 `{split['sha256']}`"
        )
    CALLS.write_text("\n".join(lines) + "\n")
    logger.info("wrote %s", CALLS)


#: The calls after the carrying ones: install, and the whole pipeline on tiny shapes; then
#: the measurements, each under the 600 s a call may run (results accumulate in
#: benchmarks/_work/gpu/results while the machine is warm, and come back in $OUT).
RUN_CALLS = (
    (
        "python3 benchmarks/gpu_kit.py install && "
        "python3 benchmarks/gpu_bench.py run --device cuda --tiny --out $OUT/tiny",
        600,
    ),
    ("python3 benchmarks/gpu_bench.py run --device cuda --backend vllm --out $OUT", 600),
    ("python3 benchmarks/gpu_bench.py run --device cuda --backend hf --out $OUT", 600),
    ("python3 benchmarks/gpu_bench.py tests --out $OUT", 600),
)
#: Said under the calls.
CALLS_NOTE = """\
If a measuring call runs out of time, run it again as two calls, one with `--shape 1B` and
one with `--shape 8B` added: each (side, backend)'s results file keeps the other shape's
rows. `python3 benchmarks/gpu_bench.py table --device cuda --out $OUT` prints the table of
everything measured so far. Paste the table (and the `*-profile.txt` summaries where a
target is missed) into `benchmarks/results/gpu.md` under a dated heading naming the GPU.
"""


# ---- check and install (there) ----------------------------------------------------------


def kit_folders() -> list[Path]:
    return sorted(p for p in REPO.glob(".vllm-*") if p.is_dir()) + sorted(
        p for p in REPO.glob(".gpu-wheels*") if p.is_dir()
    )


def check(args: argparse.Namespace) -> None:
    """Verify every kit folder present; say which parts are still to come."""
    problems = []
    for path in kit_folders():
        found = verify_sums(path)
        problems += found
        logger.info("%s: %s", path.name, "damaged" if found else f"intact, {size_of(path):,} B")
    kit_file = folder(".vllm-deps") / "kit.json"
    if kit_file.exists():
        splits = json.loads(kit_file.read_text())["split"]
        waiting = [p for s in splits for p in s["parts"] if not folder(p).is_dir()]
        logger.info("wheel parts still to come: %s", ", ".join(waiting) or "none")
    for problem in problems:
        logger.error(problem)
    if problems:
        sys.exit(1)


def install(args: argparse.Namespace) -> None:
    """Verify all parts, reassemble and check the split wheels, install the three folders."""
    deps = folder(".vllm-deps")
    splits = json.loads((deps / "kit.json").read_text())["split"]
    problems = [p for path in kit_folders() for p in verify_sums(path)]
    problems += [f"{n}: missing" for s in splits for n in s["parts"] if not folder(n).is_dir()]
    if problems:
        raise SystemExit("the kit is incomplete or damaged:\n" + "\n".join(problems))
    WHEELS.mkdir(parents=True, exist_ok=True)
    for split in splits:
        wheel = WHEELS / split["wheel"]
        with wheel.open("wb") as out:
            for i, name in enumerate(split["parts"], 1):
                with (folder(name) / f"{split['wheel']}.part{i}").open("rb") as part:
                    shutil.copyfileobj(part, out)
        if sha256(wheel) != split["sha256"]:
            raise SystemExit(f"{wheel.name}: the reassembled wheel's sha256 differs")
        logger.info("%s reassembled, sha256 matches", wheel.name)
    python = args.python or sys.executable
    vllm = WHEELS / splits[0]["wheel"]
    install_folder(python, "vllm", [vllm, *sorted(deps.glob("*.whl"))])
    install_sides(python)


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
            if "__pycache__" not in f.parts and "build" not in f.parts:
                stamp.update(str(f).encode() + f.read_bytes())
    marker = target / ".installed-from"
    if marker.exists() and marker.read_text() == stamp.hexdigest():
        logger.info("%s: reusing %s", name, target)
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    cmd = [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-warn-conflicts"]
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
    """Install ours (this checkout) and the reference (carried wheels) into their folders."""
    carried = [*REPO.glob(".gpu-wheels*/*.whl"), *WHEELS.glob("*.whl")]
    wheels = {  # by file name: two folders may carry the same dependency
        w.name: w
        for w in sorted(carried)
        if canonical(w.name.split("-")[0]) not in (*MACHINE_PACKAGES, "vllm")  # vllm: its own
    }
    if not any(name.startswith("genlm_backend-0.3.1") for name in wheels):
        raise FileNotFoundError("no genlm_backend-0.3.1 wheel in .gpu-wheels: run `prepare`")
    return {
        "ours": install_ours(python),
        "ref": install_folder(python, "ref", sorted(wheels.values())),
    }


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
    commands.add_parser("check", help="verify the folders carried so far (there)")
    p = commands.add_parser("install", help="verify, reassemble, install (there)")
    p.add_argument("--python", help="the interpreter to install for (default: this one)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    actions = {"probe": probe, "prepare": prepare, "reference": reference}
    actions |= {"check": check, "install": install}
    actions[args.command](args)


if __name__ == "__main__":
    main()
