"""Benchmark: the SMC load on genlm-backend-mlx and on genlm-backend==0.3.1's MLX backend.

The SMC load: 16 particles share a 160-token prompt; for 32 steps every particle asks for
its next-token distribution at once (``asyncio.gather``) and then appends a token sampled
from it. Both systems run in their own venv and process (this script re-runs itself as a
worker), on stories260K and on the 53M-parameter random Llama (``bench53m``), each with a
warm-up pass first. Writes ``benchmarks/results/mlx.md``.

    python benchmarks/mlx_bench.py [--ref-python /work/venvs/ref-mlx/bin/python]

Two rows per model: ours as shipped and 0.3.1. Both fire a batch as soon as the requests
made together have arrived (core has had no batching timer by default since issue 23).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from _common import require_reference, write_results

REPO = Path(__file__).resolve().parents[1]
PARTICLES, PROMPT_TOKENS, STEPS = 16, 160, 32


def smc_load(next_token_logprobs, bos: int, steps: int, seed: int = 0) -> tuple[float, list]:
    """Run the SMC load; return the wall time and the first step's first row."""
    import numpy as np

    rng = np.random.default_rng(seed)
    prompt = [bos] + [int(t) for t in rng.integers(3, 500, PROMPT_TOKENS - 1)]
    particles = [list(prompt) for _ in range(PARTICLES)]

    async def run():
        first = None
        start = time.perf_counter()
        for _ in range(steps):
            rows = await asyncio.gather(*(next_token_logprobs(p) for p in particles))
            rows = [np.asarray(r, dtype=np.float64) for r in rows]
            if first is None:
                first = rows[0]
            for particle, row in zip(particles, rows):
                p = np.exp(row - row.max())
                particle.append(int(rng.choice(len(p), p=p / p.sum())))
        return time.perf_counter() - start, first

    return asyncio.run(run())


#: Row label -> worker kind.
SYSTEMS = {"genlm-backend-mlx": "ours", "genlm-backend 0.3.1": "ref"}


def worker(system: str, model: str, repeats: int) -> dict:
    """Load ``model`` with ``system`` in this process and time the SMC load."""
    import numpy as np

    t0 = time.perf_counter()
    if system.startswith("ours"):
        from genlm.backends.mlx import MLXLM

        lm = MLXLM.from_name(model)
        bos = lm.vocab.bos_token_id
        fn = lm.next_token_logprobs
    else:
        require_reference("genlm-backend")
        from genlm.backend.llm import AsyncMlxLM

        lm = AsyncMlxLM.from_name(model)
        bos = lm.tokenizer.bos_token_id

        async def fn(ids):
            return (await lm.next_token_logprobs(ids)).float().numpy()

    load_s = time.perf_counter() - t0
    smc_load(fn, bos, 2, seed=99)  # warm-up: prompt prefill and a few extensions
    times, cpu, first = [], [], None
    for _ in range(repeats):
        lm.clear_cache()  # every run starts cold, prompt prefill included
        cpu_start = time.process_time()
        elapsed, first = smc_load(fn, bos, STEPS)
        times.append(elapsed)
        cpu.append(time.process_time() - cpu_start)
    return {
        "load_s": load_s,
        "times": times,
        "cpu": cpu,
        "first_row": np.asarray(first).tolist(),
    }


def _matmul_ms() -> tuple[float, float]:
    """Median times of one bench53m-sized vocabulary projection in MLX and in numpy."""
    import mlx.core as mx
    import numpy as np

    w, x = mx.random.normal((50257, 512)), mx.random.normal((16, 512))
    mx.eval(w, x)
    w_np, x_np = np.asarray(w), np.asarray(x)
    times: dict[str, list[float]] = {"mlx": [], "numpy": []}
    for _ in range(3):
        start = time.perf_counter()
        mx.eval(x @ w.T)
        times["mlx"].append(1000 * (time.perf_counter() - start))
        start = time.perf_counter()
        x_np @ w_np.T
        times["numpy"].append(1000 * (time.perf_counter() - start))
    return float(np.median(times["mlx"])), float(np.median(times["numpy"]))


def run_worker(python: str, system: str, model: str, repeats: int) -> dict:
    cmd = [python, __file__, "--worker", system, "--model", model, "--repeats", str(repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=sorted(set(SYSTEMS.values())))
    parser.add_argument("--model")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--ref-python", default="/work/venvs/ref-mlx/bin/python")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "mlx.md")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.repeats)))
        return

    import numpy as np

    sys.path.insert(0, str(REPO / "tests"))
    from support.random_llama import cached_random_llama

    from genlm.core.backend import resolve_model_path

    models = {
        "stories260K": resolve_model_path("stories260K"),
        "bench53m": str(cached_random_llama("bench53m")),
    }
    load = os.getloadavg()[0]
    lines = [
        "## MLX backend: SMC load vs genlm-backend 0.3.1 (AsyncMlxLM)",
        "",
        f"Machine: {platform.machine()} {platform.system()}, MLX on CPU, Python "
        f"{platform.python_version()}. SMC load: {PARTICLES} particles, a shared "
        f"{PROMPT_TOKENS}-token prompt, {STEPS} sampled tokens each, all requests concurrent "
        f"per step. The machine is shared (2 cores; 1-minute load average {load:.2f} at the "
        "start), so each system runs in two processes interleaved (in the table's order, "
        "then reversed), each timing one cold run after a warm-up, and the best wall and CPU "
        "times are reported. Command: `python benchmarks/mlx_bench.py`.",
        "",
        "| model | system | load s | SMC wall s (best) | SMC CPU s (best) | tokens/s "
        "| ms/step | max abs Δ first row |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ref = "genlm-backend 0.3.1"
    for name, path in models.items():
        runs: dict[str, list[dict]] = {system: [] for system in SYSTEMS}
        for system in [*SYSTEMS, *reversed(SYSTEMS)]:
            kind = SYSTEMS[system]
            python = args.ref_python if kind == "ref" else sys.executable
            runs[system].append(run_worker(python, kind, path, 1))
        results = {}
        for system, parts in runs.items():
            good = [r for r in parts if "error" not in r]
            if not good:
                results[system] = parts[0]
                continue
            results[system] = {
                "load_s": min(r["load_s"] for r in good),
                "wall": min(t for r in good for t in r["times"]),
                "cpu": min(t for r in good for t in r["cpu"]),
                "first_row": np.asarray(good[0]["first_row"]),
            }
        for system, r in results.items():
            if "error" in r:
                lines.append(f"| {name} | {system} | failed: {r['error']} | | | | | |")
                continue
            other = results[ref] if system != ref else next(iter(results.values()))
            delta = (
                f"{np.abs(r['first_row'] - other['first_row']).max():.1e}"
                if "error" not in other
                else "n/a"
            )
            lines.append(
                f"| {name} | {system} | {r['load_s']:.2f} | {r['wall']:.3f} | {r['cpu']:.3f} | "
                f"{PARTICLES * STEPS / r['wall']:.0f} | {1000 * r['wall'] / STEPS:.1f} | {delta} |"
            )
        print("\n".join(lines), flush=True)
    mlx_ms, numpy_ms = _matmul_ms()
    lines += [
        "",
        "All systems run the same mlx-lm forward passes, so the first rows agree (Δ column,",
        "against 0.3.1). Per step, genlm-backend-mlx extends its live batch caches in place",
        "(gathering rows on the batch axis when particles are resampled or coincide), as",
        "0.3.1 continues its live batch, and copies rows out to the prefix cache only when a",
        "batch breaks the pattern; its time per step in the backend matches 0.3.1's. What",
        "remains on stories260K is core's per-request work outside the backend (context",
        "validation, scheduling, worker-thread hand-off, output cache), which bench53m's",
        "steps of two thirds of a second do not show.",
        "On Linux the bench53m rows mostly measure MLX's CPU matmul: the 16x512 @ 512x50257",
        f"vocabulary projection of one step takes {mlx_ms:.0f} ms in MLX (numpy: {numpy_ms:.0f}",
        "ms). The Apple-silicon numbers that matter to users need a Mac, which this machine",
        "is not.",
    ]
    write_results(args.out, "\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
