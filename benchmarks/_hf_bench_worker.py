"""One side of the hf benchmark, run in its own process (and venv): ours or the reference.

Prints one JSON line: load-free timings of the SMC load and of single requests, and peak RSS.
It must import nothing from this repository when run as the reference (its venv has only
``genlm-backend==0.3.1``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time

import numpy as np
from _common import require_reference


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def load(impl: str, model: str, kv_bytes: int):
    """The model, a function returning a float64 numpy row, and a cache-clearing function."""
    if impl == "ours":
        from genlm.backends.hf import HFLM

        lm = HFLM.from_name(model, kv_cache_bytes=kv_bytes, device="cpu")

        async def logprobs(ctx):
            return np.asarray(await lm.next_token_logprobs(ctx), dtype=np.float64)

        def clear():
            lm.clear_cache()
            lm.clear_kv_cache()

        return lm, logprobs, clear, len(lm.vocab)
    require_reference()
    from genlm.backend.llm import AsyncTransformer

    lm = AsyncTransformer.from_name(model, hf_opts={"device_map": "cpu"})

    async def logprobs(ctx):
        return (await lm.next_token_logprobs(ctx)).float().cpu().numpy().astype(np.float64)

    def clear():
        lm.clear_cache()
        lm.clear_kv_cache()

    return lm, logprobs, clear, len(lm.tokenizer)


async def timed(fn, *args) -> float:
    start = time.perf_counter()
    await fn(*args)
    return time.perf_counter() - start


async def main_async(args) -> dict:
    lm, logprobs, clear, vocab_size = load(args.impl, args.model, args.kv_bytes)
    rss_loaded = rss_bytes()
    rng = np.random.default_rng(args.seed)
    context = [int(t) for t in rng.integers(3, vocab_size, args.prompt)]
    latency = {
        "cold": await timed(logprobs, context),
        "repeat": await timed(logprobs, context),
        "extend_by_one": await timed(logprobs, context + [5]),
    }
    clear()
    prompt = [int(t) for t in rng.integers(3, vocab_size, args.prompt)]
    particles = [list(prompt) for _ in range(args.particles)]
    step_times = []
    start = time.perf_counter()
    for _ in range(args.steps):
        t0 = time.perf_counter()
        rows = await asyncio.gather(*(logprobs(p) for p in particles))
        step_times.append(time.perf_counter() - t0)
        for particle, row in zip(particles, rows):
            probs = np.exp(row - row.max())
            particle.append(int(rng.choice(len(row), p=probs / probs.sum())))
    wall = time.perf_counter() - start
    result = {
        "impl": args.impl,
        "steps": args.steps,
        "smc_wall_s": wall,
        "step_s": step_times,
        "latency_s": latency,
        "rss_loaded_bytes": rss_loaded,
        "rss_peak_bytes": rss_bytes(),
    }
    if args.impl == "ours":
        result["kv_bytes_end"] = lm.kv.nbytes
        result["kv_budget"] = lm.kv.cache.max_bytes
        result["kv_stats"] = dict(lm.kv_stats)
        await lm.aclose()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=["ours", "ref"], required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--particles", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-bytes", type=int, default=256 << 20)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    main()
