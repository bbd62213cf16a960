"""GenLM against genlm-backend 0.3.1 / genlm-bytes 0.2.0 on an accelerator, in one command.

Issue 14's table: SMC steps of random-weight Llama models with the llama3.2 tokenizer
(1B shape at P=16 and P=64 particles, 8B shape at P=16; the particles share a 160-token
prompt and each step's requests are concurrent), a byte LM with beam K=4 over 120 bytes
(byte by byte, and ``prefill``), and the token-byte trie's ``weight_sum`` on rows that
live on the device (B=1 and B=32).

Both sides are installed into their own ``--target`` folders under ``benchmarks/_work/``
(so their ``genlm.bytes`` never collide) and each runs in its own process with only its
folder on ``PYTHONPATH``: ours from this checkout, the reference from wheels carried in
``.gpu-wheels/`` (git-ignored; the machine reaches no index). Both build the same
random model from the same seed.

Steps (the exact commands are in ``benchmarks/results/gpu.md``, "to run"):

    # here, with an index: the reference wheels for the device's Python, and the tokenizer
    python benchmarks/gpu_bench.py prepare --python-version 3.12
    # there: install both sides, run everything, print the markdown table
    python benchmarks/gpu_bench.py run --device cuda --out benchmarks/results/gpu_run.md
    # anywhere, under a minute on a CPU: the same pipeline on tiny shapes
    python benchmarks/gpu_bench.py run --device cpu --tiny

Timings are medians. A step's time runs from submitting every particle's request to the
last row arriving; ours delivers numpy rows on the host (its default), the reference
device tensors (synchronized before the clock stops). The reference runs with its
defaults (``AsyncTransformer`` batch_size=20, timeout=0.02 s), ours with its defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WHEELS = REPO / ".gpu-wheels"
WORK = HERE / "_work" / "gpu"
logger = logging.getLogger("gpu_bench")

#: The reference: installed with --no-deps; arsenal's and IPython's imports come as wheels.
REFERENCE = ("genlm-backend==0.3.1", "genlm-bytes==0.2.0", "arsenal")
#: Pure-python helpers the reference imports, downloaded with their dependencies.
REFERENCE_HELPERS = ("ipython",)
#: Heavier imports of the reference (numba, pandas) many GPU images already have; add
#: them with ``prepare --heavy`` when ``python -c "import numba, pandas"`` fails there
#: (llvmlite alone is ~57 MB of the 64 MiB a device call may carry, so each goes to its
#: own ``.gpu-wheels-NAME/`` folder, carried in a call of its own).
REFERENCE_HEAVY = ("numba", "llvmlite", "pandas")
#: Never installed into a side's folder: the machine's own builds are used.
MACHINE_PACKAGES = ("numpy", "torch", "scipy", "transformers")

#: Random-weight Llama shapes (Llama 3.2 1B and Llama 3.1 8B; ``tiny`` for CPU smoke runs).
SHAPES = {
    "1B": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),
    "8B": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
}

TEXT = (
    b"Once upon a time, there was a little girl named Lily. She loved to play outside in "
    b"the park with her red ball. One day, she saw a big dog."
)[:120]
TINY_TEXT = TEXT[:6]


# ---- preparing the wheel folder (run where an index is reachable) ----------------------


def tokenizer_source() -> Path:
    """The llama3.2 tokenizer in ``../shared`` (Meta licence: carried, never committed)."""
    for d in REPO.parents:
        path = d / "shared" / "models" / "tokenizers" / "llama3.2"
        if path.is_dir():
            return path
    raise FileNotFoundError("no shared/models/tokenizers/llama3.2 above this checkout")


def prepare(args: argparse.Namespace) -> None:
    """Download the reference's wheels for the device's Python into ``.gpu-wheels*/``.

    ``.gpu-wheels/`` gets the reference, its small imports and the tokenizer; with
    ``--heavy``, each heavy package goes to its own ``.gpu-wheels-NAME/`` so that each
    folder fits in one device call. Wheels already there are removed first (a folder
    holds one Python's set).
    """
    target = ["--python-version", args.python_version, "--only-binary=:all:"]
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"):
        target += ["--platform", tag]
    downloads = [(WHEELS, ["--no-deps", *REFERENCE]), (WHEELS, list(REFERENCE_HELPERS))]
    if args.heavy:
        for name in REFERENCE_HEAVY:  # numba's one dependency that matters is llvmlite
            deps = [] if name == "pandas" else ["--no-deps"]
            downloads.append((REPO / f".gpu-wheels-{name}", [*deps, name]))
    for folder in dict.fromkeys(folder for folder, _ in downloads):
        folder.mkdir(exist_ok=True)
        for wheel in folder.glob("*.whl"):
            wheel.unlink()
    for folder, packages in downloads:
        pip = [sys.executable, "-m", "pip", "download", "--dest", str(folder), *target]
        subprocess.run([*pip, *packages], check=True)
    shutil.copytree(tokenizer_source(), WHEELS / "llama3.2", dirs_exist_ok=True)
    for folder in dict.fromkeys(folder for folder, _ in downloads):
        for wheel in folder.glob("*.whl"):  # dependencies the machine has its own builds of
            if wheel.name.split("-")[0].lower() in MACHINE_PACKAGES:
                wheel.unlink()
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        logger.info("%s: %.1f MiB (a device call carries at most 64 MiB)", folder, size / 2**20)


# ---- installing both sides -------------------------------------------------------------


def install_sides(python: str) -> dict[str, Path]:
    """Install ours (this checkout) and the reference (carried wheels) into their folders.

    A folder is reused when what it was installed from is unchanged (a stamp of the
    wheels' names and of every source file of ours), so reruns skip the build.
    """
    sides = {"ours": WORK / "ours", "ref": WORK / "ref"}
    wheels = [
        str(w)
        for w in sorted(REPO.glob(".gpu-wheels*/*.whl"))
        if w.name.split("-")[0].lower() not in MACHINE_PACKAGES
    ]
    if not any(Path(w).name.startswith("genlm_backend-0.3.1") for w in wheels):
        raise FileNotFoundError(f"no genlm_backend-0.3.1 wheel in {WHEELS}: run `prepare` first")
    ours = [REPO / d for d in ("genlm-core", "genlm-backend-hf", "genlm-bytes")]
    sources = hashlib.sha256()
    for path in sorted(f for d in ours for f in (d / "src").rglob("*") if f.is_file()):
        if "__pycache__" not in path.parts:
            sources.update(str(path).encode() + path.read_bytes())
    stamps = {
        "ours": f"{python}\n{sources.hexdigest()}",
        "ref": f"{python}\n" + "\n".join(Path(w).name for w in wheels),
    }
    pip = [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-warn-conflicts"]
    commands = {
        "ours": [*pip, "--no-build-isolation", "--target", str(sides["ours"]), *map(str, ours)],
        "ref": [*pip, "--no-index", "--target", str(sides["ref"]), *wheels],
    }
    for side, folder in sides.items():
        stamp = folder / ".installed-from"
        if stamp.exists() and stamp.read_text() == stamps[side]:
            logger.info("%s: reusing %s", side, folder)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        logger.info("%s: installing into %s", side, folder)
        subprocess.run(commands[side], check=True)
        stamp.write_text(stamps[side])
    return sides


def run_side(python: str, side: str, folder: Path, args: argparse.Namespace) -> dict:
    """One side's measurements, in its own process with only its folder on the path."""
    cmd = [python, str(Path(__file__)), "worker", "--side", side, "--folder", str(folder)]
    cmd += ["--device", args.device, "--steps", str(args.steps)]
    cmd += ["--tokenizer", str(args.tokenizer)]
    cmd += ["--tiny"] if args.tiny else []
    cmd += ["--no-cudnn-sdpa"] if args.no_cudnn_sdpa else []
    env = dict(os.environ, PYTHONPATH=str(folder), HF_HUB_OFFLINE="1")
    env.update(TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
    logger.info("running %s", " ".join(cmd))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the {side} side failed:\n{out.stderr[-6000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- one side's worker -----------------------------------------------------------------


def build_model(shape: str, vocab_size: int, device: str, dtype, tokenizer):
    """A random-weight LlamaForCausalLM of ``shape``, built on ``device`` (seed 0)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=4096,
        rope_theta=500000.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.to(device=device, dtype=dtype).eval()


class Side:
    """The same questions asked of ours or of the reference."""

    def __init__(self, side: str, model, tokenizer, device: str):
        self.side, self.device = side, device
        if side == "ours":
            from genlm.backends.hf import HFLM

            self.lm = HFLM(model, tokenizer)
        else:
            from genlm.backend.llm import AsyncTransformer

            self.lm = AsyncTransformer(model, tokenizer)

    async def timed_rows(self, contexts: list[list[int]]) -> tuple[float, list]:
        """Seconds until every context's row arrived (requested concurrently), and the rows.

        The clock stops when the rows are where the side delivers them (ours: numpy on the
        host; the reference: tensors on the device, synchronized); they are then moved to
        the host as float64 numpy rows for sampling, off the clock.
        """
        import numpy as np

        start = time.perf_counter()
        rows = await asyncio.gather(*(self.lm.next_token_logprobs(c) for c in contexts))
        synchronize(self.device)
        seconds = time.perf_counter() - start
        if self.side == "ref":
            rows = [r.float().cpu().numpy() for r in rows]
        return seconds, [np.asarray(r, dtype=np.float64) for r in rows]

    def clear(self) -> None:
        self.lm.clear_cache()
        self.lm.clear_kv_cache()

    def close(self) -> None:
        """Drop the model's caches (and stop ours' worker thread) before the next model."""
        self.clear()
        if self.side == "ours":
            self.lm.close()
        self.lm = None


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


async def smc_steps(side: Side, particles: int, prompt_len: int, steps: int) -> list[float]:
    """Seconds per SMC step (the first, the prompt's prefill, excluded)."""
    import numpy as np

    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, 128000, prompt_len)]
    contexts = [list(prompt) for _ in range(particles)]
    times = []
    for _ in range(steps + 1):
        seconds, rows = await side.timed_rows(contexts)
        times.append(seconds)
        for context, row in zip(contexts, rows):  # Gumbel-max draw from each row
            context.append(int(np.argmax(row + rng.gumbel(size=row.shape))))
    side.clear()
    return times[1:]


async def byte_lm(side: Side, tokenizer, text: bytes, K: int) -> dict:
    """Seconds to score ``text`` byte by byte and with ``prefill``, each from a cold start.

    Byte by byte: the next-byte distribution, then prune and advance, per byte (output
    and KV caches are cleared before each mode).
    """
    result = {}
    for mode in ("byte_by_byte", "prefill"):
        side.clear()
        if side.side == "ours":
            from genlm.bytes import ByteLM

            blm = ByteLM(side.lm, K=K)
            state = await blm.initial((tokenizer.bos_token_id,))
            start = time.perf_counter()
            if mode == "prefill":
                state = await state.prefill(text)
            else:
                for b in text:
                    await state.logp_next()
                    state = await state.prune().advance(b)
            seconds = time.perf_counter() - start
            await blm.aclose()
        else:
            from genlm.bytes import BeamParams, ByteBeamState

            state = await ByteBeamState.initial(side.lm, BeamParams(K=K))
            start = time.perf_counter()
            if mode == "prefill":
                state = await state.prefill(text)
            else:
                for b in text:
                    await state.logp_next()
                    state = await (state.prune() << b)
            seconds = time.perf_counter() - start
            await state.cleanup()
        result[mode] = seconds
    return result


def trie_weight_sum(
    side: str, tokenizer, device: str, batches: list[int], repeats: int
) -> dict[int, float]:
    """Median seconds of ``batch_weight_sum`` on float32 probability rows on the device."""
    import torch

    if side == "ours":
        from genlm.core import TokenByteTrie, Vocabulary

        trie = TokenByteTrie(list(Vocabulary.from_tokenizer(tokenizer).tokens))
    else:
        from genlm.backend.tokenization import decode_vocab
        from genlm.bytes.trie import TokenByteTrie

        trie = TokenByteTrie(decode_vocab(tokenizer)[0], device=device)
    torch.manual_seed(0)
    out = {}
    for b in batches:
        rows = torch.softmax(torch.randn(b, len(tokenizer), device=device) * 3, dim=-1)
        times = []
        trie.batch_weight_sum(rows)  # warm-up: index tensors moved to the device
        for _ in range(repeats):
            synchronize(device)
            start = time.perf_counter()
            trie.batch_weight_sum(rows)
            synchronize(device)
            times.append(time.perf_counter() - start)
        out[b] = statistics.median(times)
    return out


def versions(side: str, folder: str) -> dict:
    """Versions of what this process imported, and where the genlm packages came from."""
    from importlib import metadata

    import torch
    import transformers

    names = ("genlm-core", "genlm-backend-hf", "genlm-bytes")
    names = names if side == "ours" else ("genlm-backend", "genlm-bytes")
    found = {n: metadata.version(n) for n in names}
    import genlm.bytes

    if not str(Path(genlm.bytes.__file__).resolve()).startswith(str(Path(folder).resolve())):
        raise RuntimeError(f"{side}: genlm.bytes came from {genlm.bytes.__file__}, not {folder}")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor()
    return {
        "packages": found,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device_name": device or platform.machine(),
    }


async def worker_main(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoTokenizer

    if args.no_cudnn_sdpa and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    tiny = args.tiny
    particle_loads = [("1B", 16), ("1B", 64), ("8B", 16)]
    if tiny:
        particle_loads = [("tiny", 4), ("tiny", 8)]
    prompt, text = (16, TINY_TEXT) if tiny else (160, TEXT)
    results: dict = {"versions": versions(args.side, args.folder), "smc": {}}
    shape_now, side = None, None
    for shape, particles in particle_loads:
        if shape != shape_now:
            if side is not None:  # free the last model before building the next
                side.close()
                side = None
                if args.device.startswith("cuda"):
                    torch.cuda.empty_cache()
            model = build_model(shape, len(tokenizer), args.device, dtype, tokenizer)
            shape_now, side = shape, Side(args.side, model, tokenizer, args.device)
            del model
            if shape in ("1B", "tiny"):  # the byte LM runs on the small model
                results["bytes"] = await byte_lm(side, tokenizer, text, K=4)
        times = await smc_steps(side, particles, prompt, args.steps)
        results["smc"][f"{shape}/{particles}"] = step = statistics.median(times)
        logger.info("%s %s P=%d: %.1f ms/step", args.side, shape, particles, 1e3 * step)
    side.close()
    batches, repeats = ([1, 4], 2) if tiny else ([1, 32], 20)
    results["trie"] = trie_weight_sum(args.side, tokenizer, args.device, batches, repeats)
    return results


# ---- the table ----------------------------------------------------------------------


def table(ours: dict, ref: dict, args: argparse.Namespace) -> str:
    """The issue's rows, ours against the reference, with versions."""

    def ms(s: float) -> str:
        return f"{s * 1e3:.1f}"

    rows = []
    for key in ours["smc"]:
        shape, particles = key.split("/")
        o, r = ours["smc"][key], ref["smc"][key]
        rows.append((f"{shape}-shape, P={particles}, ms per step", ms(o), ms(r), r / o))
    n = len(TINY_TEXT if args.tiny else TEXT)
    o, r = ours["bytes"]["byte_by_byte"], ref["bytes"]["byte_by_byte"]
    name = f"byte LM K=4, {n} bytes, byte by byte, B/s"
    rows.append((name, f"{n / o:.1f}", f"{n / r:.1f}", r / o))
    o, r = ours["bytes"]["prefill"], ref["bytes"]["prefill"]
    rows.append((f"byte LM K=4, prefill {n} bytes, s", f"{o:.2f}", f"{r:.2f}", r / o))
    for b in ours["trie"]:
        o, r = ours["trie"][b], ref["trie"][b]
        rows.append((f"trie weight_sum on {args.device} rows, B={b}, ms", ms(o), ms(r), r / o))
    v, rv = ours["versions"], ref["versions"]
    ours_names = ", ".join(f"{k} {x}" for k, x in v["packages"].items())
    ref_names = ", ".join(f"{k} {x}" for k, x in rv["packages"].items())
    lines = [
        f"Device: {v['device_name']} ({args.device}); Python {v['python']}, torch {v['torch']}, "
        f"transformers {v['transformers']}; {'float32' if args.device == 'cpu' else 'bf16'} "
        f"random-weight Llama, llama3.2 tokenizer; {args.steps} SMC steps (medians)"
        + ("; cuDNN SDPA off" if args.no_cudnn_sdpa else "")
        + (" — tiny smoke shapes, not the issue's loads" if args.tiny else "")
        + ".",
        f"Ours: {ours_names} (commit {git_commit()}). Reference: {ref_names}.",
        "",
        "| load | ours | reference | reference / ours |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {name} | {o} | {r} | {x:.2f}x |" for name, o, r, x in rows]
    return "\n".join(lines)


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(args: argparse.Namespace) -> None:
    if args.tokenizer is None:
        carried = WHEELS / "llama3.2"
        args.tokenizer = carried if carried.is_dir() else tokenizer_source()
    python = args.python or sys.executable
    sides = install_sides(python)
    results = {side: run_side(python, side, folder, args) for side, folder in sides.items()}
    text = table(results["ours"], results["ref"], args)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare", help="download the reference wheels into .gpu-wheels/")
    p.add_argument("--python-version", default=f"{sys.version_info[0]}.{sys.version_info[1]}")
    p.add_argument("--heavy", action="store_true", help="also numba, llvmlite and pandas")
    for name in ("run", "worker"):
        p = commands.add_parser(name)
        p.add_argument("--device", default="cuda")
        p.add_argument("--tiny", action="store_true", help="tiny shapes: a smoke run")
        p.add_argument("--steps", type=int, default=None)
        p.add_argument("--tokenizer", type=Path, default=None)
        p.add_argument("--no-cudnn-sdpa", action="store_true")
        if name == "run":
            p.add_argument("--python", help="interpreter of both sides (default: this one)")
            p.add_argument("--out", help="also write the table to this file")
        else:
            p.add_argument("--side", choices=["ours", "ref"], required=True)
            p.add_argument("--folder", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.command == "prepare":
        prepare(args)
        return
    if args.steps is None:
        args.steps = 2 if args.tiny else 32
    if args.command == "run":
        run(args)
    else:
        print(json.dumps(asyncio.run(worker_main(args))))


if __name__ == "__main__":
    main()
