"""Unseeded sample calls made together run as one engine run, each with its own arguments
and cancellation, on the session's in-process engine (``max_num_seqs=2``: vLLM schedules
a run's requests two at a time)."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import numpy as np

from .conftest import hold_steps, rows_during_a_generation, unfinished_at_row_admissions
from .test_vllm_logprobs import ATOL, distinct_contexts


def greedy_alone(lm, prompt: list[int], max_tokens: int, eos: list[int]) -> list[int]:
    return asyncio.run(lm.sample(prompt, max_tokens, eos, temperature=0))


def test_gathered_samples_of_different_arguments_are_one_engine_run(vllm_lm, runs):
    """Five sample calls and a batch_sample of two prompts, gathered, with their own
    max_tokens, EOS ids and temperatures, are one engine run of six requests (max_tokens=0
    needs none); each greedy call gets what it gets alone (EOS stops included), the tempered
    one its length. They were five runs, one after another."""
    prompts = distinct_contexts(6, seed=11)
    full = [greedy_alone(vllm_lm, p, 6, []) for p in prompts[:3]]
    runs.clear()

    async def together():
        return await asyncio.gather(
            vllm_lm.sample(prompts[0], 6, [], temperature=0),
            vllm_lm.sample(prompts[1], 3, [], temperature=0),
            vllm_lm.sample(prompts[2], 6, [full[2][2]], temperature=0),
            vllm_lm.sample(prompts[3], 5, [], temperature=1.5),
            vllm_lm.sample(prompts[4], 0, [], temperature=0),
            vllm_lm.batch_sample([prompts[0], prompts[5]], 4, [], temperature=0),
        )

    first, short, stopped, tempered, none, batch = asyncio.run(together())
    assert [len(keys) for keys in runs] == [6]
    assert first == full[0]
    assert short == full[1][:3]
    assert stopped == full[2][: full[2].index(full[2][2]) + 1]
    assert len(tempered) == 5 and none == []
    assert batch == [full[0][:4], greedy_alone(vllm_lm, prompts[5], 4, [])]


def test_calls_made_while_a_run_goes_form_the_next_run(vllm_lm, runs, monkeypatch):
    """Calls made while a run is on the engine do not start runs of their own, one after
    another: they all wait, and then go together in one run."""
    # The first run is held until the later calls are made.
    started, proceed, _ = hold_steps(vllm_lm.llm.llm_engine, monkeypatch)
    prompts = distinct_contexts(4, seed=12)

    async def during_a_run():
        first = asyncio.create_task(vllm_lm.sample(prompts[0], 2, [], temperature=0))
        await asyncio.to_thread(started.wait, 60)
        later = []
        for prompt in prompts[1:]:  # one per turn of the event loop
            later.append(asyncio.create_task(vllm_lm.sample(prompt, 2, [], temperature=0)))
            await asyncio.sleep(0)
        proceed.set()
        return await first, await asyncio.gather(*later)

    first, later = asyncio.run(during_a_run())
    assert [len(keys) for keys in runs] == [1, 3]
    assert [len(tokens) for tokens in [first, *later]] == [2, 2, 2, 2]


def test_a_cancelled_call_is_aborted_and_the_others_of_its_run_finish(vllm_lm, runs, monkeypatch):
    """Cancelling one of three calls in a run aborts its request at the next engine step
    (one abort, of one request, after the first step), while the other two run to their
    ends with what they get alone."""
    prompts = distinct_contexts(3, seed=13)
    full = [greedy_alone(vllm_lm, p, 6, []) for p in prompts[1:]]
    engine = vllm_lm.llm.llm_engine
    started, proceed, steps = hold_steps(engine, monkeypatch)
    abort, aborts = engine.abort_request, []

    def recorded_abort(request_ids, *args, **kwargs):
        aborts.append((len(steps), list(request_ids)))
        return abort(request_ids, *args, **kwargs)

    monkeypatch.setattr(engine, "abort_request", recorded_abort)
    runs.clear()

    async def cancel_one():
        cancelled = asyncio.create_task(vllm_lm.sample(prompts[0], 300, [], temperature=1.0))
        others = [
            asyncio.create_task(vllm_lm.sample(prompts[1], 6, [], temperature=0)),
            asyncio.create_task(vllm_lm.sample(prompts[2], 6, [full[1][3]], temperature=0)),
        ]
        await asyncio.to_thread(started.wait, 60)
        cancelled.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await cancelled
        proceed.set()
        return await asyncio.gather(*others)

    finished = asyncio.run(cancel_one())
    assert [len(keys) for keys in runs] == [3]
    assert aborts == [(1, runs[0][:1])]
    assert finished == [full[0], full[1][: full[1].index(full[1][3]) + 1]]
    assert not engine.has_unfinished_requests()


def test_a_bad_call_fails_alone_before_its_run(vllm_lm, runs):
    """A call with a bad argument fails on its own, when it is made; the calls gathered
    with it still run, together."""
    prompts = distinct_contexts(2, seed=14)

    async def with_a_bad_one():
        return await asyncio.gather(
            vllm_lm.sample(prompts[0], 2, [], temperature=0),
            vllm_lm.sample(prompts[1], 2, [], temperature=-1.0),
            vllm_lm.sample([len(vllm_lm.vocab)], 2, [], temperature=0),
            vllm_lm.sample(prompts[1], 2, [], temperature=0),
            return_exceptions=True,
        )

    good, negative, out_of_vocabulary, other = asyncio.run(with_a_bad_one())
    assert isinstance(negative, ValueError) and "temperature" in str(negative)
    assert type(out_of_vocabulary).__name__ == "InvalidContextError"
    assert len(good) == len(other) == 2
    assert [len(keys) for keys in runs] == [2]


def test_the_facades_batch_sample_is_one_engine_run(vllm_lm, runs):
    """genlm.backend's AsyncVirtualLM.batch_sample (a gather of its sample, as in
    genlm-backend 0.3) is one engine run, as vLLM's engine batched 0.3's generate calls; its
    samples leave the EOS out, as documented."""
    from genlm.backend.llm import AsyncVirtualLM

    facade = AsyncVirtualLM(vllm_lm)
    prompts = distinct_contexts(4, seed=15)
    full = [greedy_alone(vllm_lm, p, 5, []) for p in prompts]
    runs.clear()
    drawn = asyncio.run(facade.batch_sample(prompts, 5, [full[0][1]], temperature=0))
    assert [len(keys) for keys in runs] == [4]
    for tokens, alone in zip(drawn, full):
        stop = alone.index(full[0][1]) if full[0][1] in alone else len(alone)
        assert tokens == alone[:stop]


def test_a_row_batch_runs_between_two_steps_of_a_generation(vllm_lm, expected, monkeypatch):
    """Rows asked for while an unseeded generation runs are computed beside it, between two
    of its steps, not after its 300 steps; they equal transformers' rows, and the
    generation still draws all its tokens. The row batch used to wait for the generation's
    end on the worker."""
    engine = vllm_lm.llm.llm_engine
    vllm_lm.clear_cache()
    gate = hold_steps(engine, monkeypatch)
    beside = unfinished_at_row_admissions(engine, monkeypatch)
    prompt, *contexts = distinct_contexts(4, seed=13)
    generation = vllm_lm.sample(prompt, 300, [], temperature=1.0)
    rows, running, tokens = asyncio.run(
        rows_during_a_generation(vllm_lm, gate, contexts, generation)
    )
    assert running and len(tokens) == 300
    assert len(beside) == 3 and min(beside) >= 1  # the generation's request was in the engine
    for context, row in zip(contexts, rows):
        np.testing.assert_allclose(row, expected(context), atol=ATOL)


def test_a_generation_cancelled_while_it_made_way_is_aborted(vllm_lm, monkeypatch):
    """Cancelled while a row batch runs between two of its steps, a generation's request is
    aborted when the generation resumes: the engine is left with nothing to run, after far
    fewer steps than the 300 tokens asked for, and the rows are answered."""
    engine = vllm_lm.llm.llm_engine
    vllm_lm.clear_cache()
    add, step = engine.add_request, engine.step
    stepped, rows_in, held, release = (threading.Event() for _ in range(4))
    steps: list[int] = []

    def recording_add(request_id, *args, **kwargs):
        if request_id.startswith("genlm-row-"):
            rows_in.set()
        return add(request_id, *args, **kwargs)

    def holding_step():
        steps.append(1)
        outputs = step()
        stepped.set()
        if rows_in.is_set() and not held.is_set():  # the row batch's first step
            held.set()
            release.wait(60)
        return outputs

    monkeypatch.setattr(engine, "add_request", recording_add)
    monkeypatch.setattr(engine, "step", holding_step)
    prompt, context = distinct_contexts(2, seed=15)

    async def cancel_while_rows_run():
        generation = asyncio.create_task(vllm_lm.sample(prompt, 300, [], temperature=1.0))
        await asyncio.to_thread(stepped.wait, 60)
        rows = asyncio.ensure_future(vllm_lm.next_token_logprobs(context))
        await asyncio.to_thread(held.wait, 60)
        generation.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await generation
        release.set()
        row = await asyncio.wait_for(rows, 120)
        # Queued behind the generation's rest: runs once it has stopped.
        left = await vllm_lm.worker.run_async(engine.has_unfinished_requests)
        return row, left

    row, left = asyncio.run(cancel_while_rows_run())
    assert held.is_set() and not left and len(steps) < 300
    assert row.shape == (len(vllm_lm.vocab),)


def test_generations_of_two_event_loops_both_advance(vllm_lm):
    """A generation on each of two event loops (threads): each makes way for the other
    between its steps, and both draw all their tokens. Each part of a generation takes an
    engine step before it may make way again; the two once handed the worker back and
    forth without stepping, forever."""
    prompts = distinct_contexts(2, seed=16)
    drawn: dict[int, list[int]] = {}

    def generate(i):
        drawn[i] = asyncio.run(vllm_lm.sample(prompts[i], 60, [], temperature=1.0))

    threads = [threading.Thread(target=generate, args=(i,), daemon=True) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert {i: len(tokens) for i, tokens in drawn.items()} == {0: 60, 1: 60}
    assert not vllm_lm.llm.llm_engine.has_unfinished_requests()


def test_a_cancel_stops_a_generation_that_a_waiting_row_batch_steps(vllm_lm, monkeypatch):
    """A generation filling the engine's request slots (``max_num_seqs=2``, two prompts): a
    row batch waits for a slot, stepping the generation's requests along. Cancelling the
    generation aborts them at the batch's next step, as the generation's own run would,
    and the row comes at once; the batch used to step the cancelled generation to its end."""
    engine = vllm_lm.llm.llm_engine
    vllm_lm.clear_cache()
    step, steps = engine.step, []

    def counting_step():
        steps.append(1)
        return step()

    monkeypatch.setattr(engine, "step", counting_step)
    prompts, context = distinct_contexts(2, seed=17), [5, 6, 7]  # the row: one step

    async def cancel_while_rows_wait():
        generation = asyncio.create_task(vllm_lm.batch_sample(prompts, 300, [], temperature=1.0))
        while len(steps) < 3:
            await asyncio.sleep(0.001)
        rows = asyncio.ensure_future(vllm_lm.next_token_logprobs(context))
        for _ in range(60000):  # until the row request is in the engine, waiting for a slot
            if any(key.startswith("genlm-row-") for key in vllm_lm._live):
                break
            await asyncio.sleep(0.001)
        cancelled_at = len(steps)
        generation.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await generation
        row = await asyncio.wait_for(rows, 120)
        return cancelled_at, len(steps), row

    cancelled_at, answered_at, row = asyncio.run(cancel_while_rows_wait())
    # A few steps may pass while the loop delivers the cancel; the generation had ~300 left.
    assert answered_at - cancelled_at <= 20, (cancelled_at, answered_at)
    assert row.shape == (len(vllm_lm.vocab),)
    assert not engine.has_unfinished_requests()
