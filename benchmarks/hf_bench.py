"""Benchmark the hf backend against genlm-backend 0.3.1's ``AsyncTransformer``, side by side.

The SMC load: 16 particles share a 160-token prompt; each of 32 steps asks every particle's
next-token distribution concurrently (``asyncio.gather``), then appends a sampled token to
each. Run on the 53M-parameter random Llama (``bench53m``, GPT-2 tokenizer) and on
stories260K. Each side runs in its own subprocess (the reference in its own venv), which
also reports single-request latency (a 160-token context: cold, repeated, extended by one
token) and its peak RSS.

    python benchmarks/hf_bench.py [--ref-python /work/venvs/ref-backend/bin/python]

Writes ``benchmarks/results/hf.md`` and ``benchmarks/results/hf.png``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
from pathlib import Path

from _common import write_results

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "_hf_bench_worker.py"
logger = logging.getLogger("hf_bench")


def model_dirs() -> dict[str, str]:
    sys.path.insert(0, str(REPO / "tests"))
    from support.random_llama import cached_random_llama

    from genlm.core.backend import resolve_model_path

    return {
        "bench53m": str(cached_random_llama("bench53m")),
        "stories260K": resolve_model_path("stories260K"),
    }


def run_side(python: str, impl: str, model: str, args) -> dict:
    cmd = [python, str(WORKER), "--impl", impl, "--model", model, "--steps", str(args.steps)]
    cmd += ["--particles", str(args.particles), "--prompt", str(args.prompt)]
    cmd += ["--kv-bytes", str(args.kv_bytes)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    env.pop("PYTHONPATH", None)
    logger.info("running %s", " ".join(cmd))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{impl} on {model} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.1f} s"


def command(args) -> str:
    """The command line that reproduces the run (options left at their defaults omitted)."""
    flags = [
        f"--{name} {value}"
        for name, value, default in (
            ("steps", args.steps, 32),
            ("particles", args.particles, 16),
            ("prompt", args.prompt, 160),
        )
        if value != default
    ]
    return " ".join(["python benchmarks/hf_bench.py", *flags])


def write_markdown(results: dict, args, path: Path) -> None:
    load = os.getloadavg()
    lines = [
        "## hf backend: SMC load and single requests vs genlm-backend 0.3.1 (AsyncTransformer)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other jobs (load "
        f"average {load[0]:.1f} at the end of the run), CPU, fp32, {args.threads} torch "
        "thread(s) on both sides (`OMP_NUM_THREADS`; on this oversubscribed box one thread "
        "is faster for both, as OpenMP barriers stall when threads are descheduled). "
        f"Command: `{command(args)}`.",
        f"SMC load: {args.particles} particles, a shared {args.prompt}-token prompt, {args.steps} "
        "sampled tokens each, every step's requests concurrent. Each side runs in its own "
        f"process; ours with `kv_cache_bytes={args.kv_bytes}` ({mib(args.kv_bytes)}).",
        "",
        "| model | measure | reference | ours | reference / ours |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, sides in results.items():
        ref, ours = sides["ref"], sides["ours"]
        lines.append(
            f"| {name} | SMC wall time ({args.steps} steps) | {ms(ref['smc_wall_s'])} | "
            f"{ms(ours['smc_wall_s'])} | **{ref['smc_wall_s'] / ours['smc_wall_s']:.1f}x** |"
        )
        ref_step = sorted(ref["step_s"][1:])[len(ref["step_s"][1:]) // 2]
        our_step = sorted(ours["step_s"][1:])[len(ours["step_s"][1:]) // 2]
        lines.append(
            f"| {name} | median step after the first | {ms(ref_step)} | {ms(our_step)} | "
            f"{ref_step / our_step:.1f}x |"
        )
        for key, label in (
            ("cold", f"one {args.prompt}-token context, cold"),
            ("repeat", "the same context again"),
            ("extend_by_one", "that context plus one token"),
        ):
            r, o = ref["latency_s"][key], ours["latency_s"][key]
            lines.append(f"| {name} | {label} | {ms(r)} | {ms(o)} | {r / o:.1f}x |")
        lines.append(
            f"| {name} | peak RSS (after load) | {mib(ref['rss_peak_bytes'])} "
            f"({mib(ref['rss_loaded_bytes'])}) | {mib(ours['rss_peak_bytes'])} "
            f"({mib(ours['rss_loaded_bytes'])}) | |"
        )
        lines.append(
            f"| {name} | our KV cache at the end / budget | | "
            f"{mib(ours['kv_bytes_end'])} / {mib(ours['kv_budget'])} | |"
        )
        stats = ours["kv_stats"]
        lines.append(
            f"| {name} | our tokens run / reused from KV (all requests) | | "
            f"{stats['computed_tokens']} / {stats['reused_tokens']} | |"
        )
    lines += [
        "",
        "The reference recomputes every context from scratch (its KV reuse needs an explicit "
        "`cache_kv`), computing logits for every position; ours resumes each request from "
        "the longest cached prefix, so a step runs one new token per particle. 'The same "
        "context again' is an output-cache hit on both sides. The machine is shared with "
        "other jobs, so absolute times are noisy; both sides ran back to back in this run.",
        "",
    ]
    write_results(path, "\n".join(lines))


def plot(results: dict, particles: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (name, sides) in zip(axes[0], results.items()):
        for impl, label in (("ref", "genlm-backend 0.3.1"), ("ours", "genlm-backend-hf")):
            steps = sides[impl]["step_s"]
            ax.plot(range(1, len(steps) + 1), [s * 1e3 for s in steps], marker=".", label=label)
        ax.set_yscale("log")
        ax.set_xlabel("SMC step")
        ax.set_ylabel("step wall time (ms, log)")
        ratio = sides["ref"]["smc_wall_s"] / sides["ours"]["smc_wall_s"]
        ax.set_title(f"{name}: {particles} particles, {ratio:.0f}x faster overall")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref-python", default="/work/venvs/ref-backend/bin/python")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--particles", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=160)
    parser.add_argument("--kv-bytes", type=int, default=256 << 20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides")
    parser.add_argument("--models", nargs="*", default=["bench53m", "stories260K"])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    dirs = model_dirs()
    results = {}
    for name in args.models:
        results[name] = {
            "ours": run_side(sys.executable, "ours", dirs[name], args),
            "ref": run_side(args.ref_python, "ref", dirs[name], args),
        }
        logger.info(
            "%s: ref %.2fs, ours %.2fs",
            name,
            results[name]["ref"]["smc_wall_s"],
            results[name]["ours"]["smc_wall_s"],
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hf.json").write_text(json.dumps(results, indent=1))
    write_markdown(results, args, args.out / "hf.md")
    plot(results, args.particles, args.out / "hf.png")
    logger.info("wrote %s", args.out / "hf.md")


if __name__ == "__main__":
    main()
