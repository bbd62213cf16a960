"""The vLLM backend's context limit, cancelled native sampling, and platform-free seeded
sampling, on the session's in-process engine (``max_model_len=512``)."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

from genlm.core import InvalidContextError
from genlm.core._sampling import sample_token

from .conftest import hold_steps
from .test_vllm_logprobs import ATOL, distinct_contexts


def long_context(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 50257, size=n)]


def test_limit_leaves_room_for_one_output_token(vllm_lm, expected):
    """max_model_len=512: 511 tokens run (vLLM needs room for one output token), 512 raise
    on the caller's side, and a too-long request never fails its batch-mates."""
    assert vllm_lm.max_context_length == 511
    vllm_lm.clear_cache()
    contexts = [long_context(511, seed=0), long_context(512, seed=1), [5, 6, 7]]

    async def together():
        return await asyncio.gather(
            *(vllm_lm.next_token_logprobs(c) for c in contexts), return_exceptions=True
        )

    first, too_long, last = asyncio.run(together())
    assert isinstance(too_long, InvalidContextError)
    assert "512 tokens" in str(too_long) and "maximum of 511" in str(too_long)
    np.testing.assert_allclose(first, expected(contexts[0]), atol=ATOL)
    np.testing.assert_allclose(last, expected(contexts[2]), atol=ATOL)
    with pytest.raises(InvalidContextError):
        asyncio.run(vllm_lm.sample(long_context(600, seed=2), max_tokens=2))


def test_cancelled_native_sampling_frees_the_worker(vllm_lm, monkeypatch):
    """Cancelling an unseeded generation stops it at the next engine step and aborts its
    requests: one step runs instead of the 300 the generation needed."""
    engine = vllm_lm.llm.llm_engine
    started, proceed, steps = hold_steps(engine, monkeypatch)

    async def cancel_midway():
        prompts = distinct_contexts(2, seed=7)
        task = asyncio.create_task(
            vllm_lm.batch_sample(prompts, max_tokens=300, eos_token_ids=[], temperature=1.0)
        )
        await asyncio.to_thread(started.wait, 60)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        proceed.set()
        # The worker runs calls in order: this one starts once the generation has stopped.
        return await vllm_lm.worker.run_async(
            lambda: (len(steps), engine.has_unfinished_requests())
        )

    assert asyncio.run(cancel_midway()) == (1, False)


def test_seeded_sampling_is_core_sampling_over_the_rows(vllm_lm):
    """A seed draws with core's sampler from this backend's rows, whatever the platform:
    the tokens equal a hand-written loop over next_token_logprobs with the same generator."""
    context = distinct_contexts(1, seed=8)[0]
    rng = np.random.default_rng(99)
    by_hand, ctx = [], list(context)
    for _ in range(5):
        token = sample_token(vllm_lm.next_token_logprobs_sync(ctx), rng, 0.7)
        by_hand.append(token)
        ctx.append(token)
    sampled = asyncio.run(
        vllm_lm.sample(context, max_tokens=5, eos_token_ids=[], temperature=0.7, seed=99)
    )
    assert sampled == by_hand
    prompts = distinct_contexts(3, seed=9)
    batch = asyncio.run(vllm_lm.batch_sample(prompts, max_tokens=3, eos_token_ids=[], seed=5))
    streams = np.random.SeedSequence(5).spawn(3)
    for prompt, stream, got in zip(prompts, streams, batch):
        rng, ctx, want = np.random.default_rng(stream), list(prompt), []
        for _ in range(3):
            want.append(sample_token(vllm_lm.next_token_logprobs_sync(ctx), rng, 1.0))
            ctx.append(want[-1])
        assert got == want


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"temperature": float("nan")}, ValueError),
        ({"temperature": float("inf")}, ValueError),
        ({"temperature": -1.0}, ValueError),
        ({"max_tokens": 2.5}, TypeError),
        ({"max_tokens": -1}, ValueError),
    ],
)
def test_native_sampling_checks_arguments_like_core(vllm_lm, arguments, error):
    """Unseeded (vLLM's sampler) sample and batch_sample refuse what core's sample refuses,
    before the engine runs: NaN and inf temperatures and max_tokens=2.5 used to reach
    vLLM's SamplingParams (only negative values were checked)."""
    call = {"max_tokens": 3, "temperature": 1.0, **arguments}
    with pytest.raises(error, match="max_tokens|temperature"):
        asyncio.run(vllm_lm.sample([5, 6], call["max_tokens"], temperature=call["temperature"]))
    with pytest.raises(error, match="max_tokens|temperature"):
        asyncio.run(
            vllm_lm.batch_sample([[5, 6]], call["max_tokens"], temperature=call["temperature"])
        )


@pytest.mark.parametrize("outside", [-1, 10**6])
def test_eos_ids_outside_the_vocabulary_stop_nothing_on_either_sampler(vllm_lm, outside):
    """An EOS id no token has is never drawn, so it stops nothing: unseeded (vLLM's sampler)
    as seeded (core's), where vLLM refused the request on the worker. A real EOS id beside
    it still stops the draw."""
    greedy = asyncio.run(vllm_lm.sample([5, 6], 4, eos_token_ids=[], temperature=0))
    assert len(greedy) == 4
    for seed in (None, 1):
        drawn = asyncio.run(
            vllm_lm.sample([5, 6], 4, eos_token_ids=[outside], temperature=0, seed=seed)
        )
        assert drawn == greedy, seed
        stopped = asyncio.run(
            vllm_lm.sample([5, 6], 4, eos_token_ids=[outside, greedy[1]], temperature=0, seed=seed)
        )
        assert stopped == greedy[:2], seed
