"""A failing backend, bad input and close under load, driven by FaultyLM (issue 12,
items 3, 5, 7, 8, 18)."""

import asyncio
import gc
import os
import threading
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support.faulty import Fault, FaultyLM, within

from genlm.core import BackendError, InvalidContextError, ModelClosedError, _model, _validation
from genlm.core._sampling import sample_token
from genlm.core.backend import Request, validate_context
from genlm.core.mock import mock_logprobs

BAD_ROWS = ["nan", "posinf", "neginf", "logits", "shifted", "wide", "short", "int"]


def run(coro):
    return asyncio.run(coro)


async def until(predicate, timeout_s=5.0):
    """Yield to the loop until ``predicate()`` holds; fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"{predicate} never held"
        await asyncio.sleep(0.002)


def outcomes_of(lm, contexts):
    """Each context's row or exception, all requested at once (so they can share batches)."""

    async def main():
        requests = (lm.next_token_logprobs(c) for c in contexts)
        return await asyncio.gather(*requests, return_exceptions=True)

    return run(main())


@pytest.fixture
def lm():
    """A healthy FaultyLM, closed after the test."""
    model = FaultyLM()
    yield model
    model.close()


@pytest.fixture
def blocked():
    """``(lm, gate)``: a FaultyLM whose first batch blocks until ``gate`` is set."""
    model, gate = FaultyLM(), threading.Event()
    model.fail_next_call(Fault(block=gate))
    yield model, gate
    gate.set()
    model.close()


async def start_blocked_batch(lm):
    """Request ``[1]`` and return its future once the backend has started (and blocks on) it."""
    running = asyncio.ensure_future(lm.next_token_logprobs([1]))
    await until(lm.started.is_set)
    return running


async def cancel_aclose(lm):
    """An ``aclose()`` cancelled by a timeout while the blocked batch runs."""
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(lm.aclose(), 0.05)


class TestBadRows:
    @pytest.mark.parametrize("bad_row", BAD_ROWS)
    def test_bad_batch_fails_its_waiters_and_is_not_cached(self, bad_row, lm):
        """Every waiter of a corrupted batch gets a BackendError naming the backend;
        nothing is cached, and the same contexts are computed afresh afterwards."""
        lm.fail_next_call(Fault(bad_row=bad_row))
        for outcome in outcomes_of(lm, [(1,), (2,), (1,)]):
            assert isinstance(outcome, BackendError)
            assert "FaultyLM 'faulty'" in str(outcome)
        assert len(lm.output_cache) == 0
        np.testing.assert_allclose(lm.next_token_logprobs_sync([1]), lm.expected((1,)), atol=1e-6)
        assert len(lm.batches) == 2

    @pytest.mark.parametrize(
        ("bad_row", "says"),
        [("nan", "NaN"), ("posinf", r"\+inf"), ("neginf", "-inf everywhere"), ("logits", "> 0")],
    )
    def test_message_names_the_row_the_context_and_the_problem(self, bad_row, says, lm):
        """The error says which row, which context and what is wrong with it."""
        lm.fail_context((5, 6), Fault(bad_row=bad_row))
        with pytest.raises(BackendError, match=rf"row 1 .*\(5, 6\).*{says}"):
            lm.batch_next_token_logprobs_sync([[1], [5, 6]])
        assert len(lm.output_cache) == 0

    def test_only_the_batch_holding_a_bad_row_fails(self):
        """With two batches in flight, the one without the NaN row delivers its rows."""
        lm = FaultyLM(max_batch_size=2, cache_bytes=0)
        lm.fail_context((2,), Fault(bad_row="nan"))
        contexts = [(1,), (2,), (3,), (4,)]
        outcomes = outcomes_of(lm, contexts)
        assert lm.batches == [[(1,), (2,)], [(3,), (4,)]]
        assert all(isinstance(o, BackendError) for o in outcomes[:2])
        for context, row in zip(contexts[2:], outcomes[2:]):
            np.testing.assert_allclose(row, lm.expected(context), atol=1e-6)
        lm.close()

    def test_minus_inf_entries_are_legitimate(self):
        """A row with impossible tokens (-inf) but finite mass elsewhere passes untouched."""

        class Sparse(FaultyLM):
            def _logprobs_batch(self, contexts, variant):
                row = np.full(len(self.vocab), -np.inf)
                row[[2, 5]] = np.log([0.25, 0.75])
                return np.stack([row] * len(contexts))

        lm = Sparse()
        row = lm.next_token_logprobs_sync([1])
        assert np.isneginf(row).sum() == len(lm.vocab) - 2
        np.testing.assert_allclose(np.exp(row[[2, 5]]), [0.25, 0.75], rtol=1e-6)
        lm.close()

    @settings(max_examples=60, deadline=None)
    @given(
        logits=st.lists(
            st.lists(
                st.one_of(st.floats(-120, 30, width=32), st.just(-np.inf)), min_size=1, max_size=40
            ),
            min_size=1,
            max_size=4,
        ).filter(lambda rows: len({len(r) for r in rows}) == 1),
        shift=st.sampled_from([0.0, 5e-4, -5e-4, 3e-3, -3e-3]),
    )
    def test_the_row_checks_agree_with_a_float64_reference(self, logits, shift):
        """row_summary's maxima and first-row logsumexp equal a float64 computation in plain
        Python; check_rows accepts rows normalized within the tolerance and names the total
        of a first row off by more."""
        from genlm.core._rows import row_summary

        rows = []
        for raw in logits:
            finite = [x for x in raw if x != -np.inf] or [0.0]
            top = max(finite)
            total = top + np.log(sum(np.exp(np.float64(x) - top) for x in finite))
            rows.append([x - total + shift if x != -np.inf else x for x in raw])
        if all(x == -np.inf for x in rows[0]):
            rows[0][0] = shift
        out = np.array(rows, dtype=np.float32)
        row_max, first = row_summary(out)
        assert row_max.tolist() == [max(row) for row in out.tolist()]
        values = out[0].astype(np.float64)
        top = values.max()
        expected = top + np.log(sum(np.exp(x - top) for x in values.tolist()))
        assert abs(first - expected) < 1e-6
        contexts = [(i,) for i in range(len(rows))]
        width = out.shape[1]
        in_range = all(-np.log(width) - 1e-3 <= m <= 1e-3 for m in row_max.tolist())
        if in_range and abs(expected) <= 1e-3 - 1e-6:
            _model.check_rows(row_max, first, width, contexts, "x")
        elif in_range and abs(expected) > 1e-3 + 1e-6:
            with pytest.raises(BackendError, match="row 0 .* total probability"):
                _model.check_rows(row_max, first, width, contexts, "x")
        elif not in_range:
            with pytest.raises(BackendError, match="row \\d+ of a batch"):
                _model.check_rows(row_max, first, width, contexts, "x")

    @settings(max_examples=40, deadline=None)
    @given(
        faulty=st.sets(st.integers(0, 11), max_size=4),
        batch_size=st.integers(1, 5),
        how=st.sampled_from(["nan", "neginf", "raise"]),
    )
    def test_failures_stay_inside_their_batches(self, faulty, batch_size, how):
        """Random faulty contexts among 12: a request fails iff its batch held one; every
        other request gets its exact row."""
        lm = FaultyLM(16, max_batch_size=batch_size, cache_bytes=0)
        for i in faulty:
            fault = Fault(raises=ValueError("boom")) if how == "raise" else Fault(bad_row=how)
            lm.fail_context((i, 1), fault)
        contexts = [(i, 1) for i in range(12)]
        outcomes = outcomes_of(lm, contexts)
        batch_of = {c: tuple(b) for b in lm.batches for c in b}
        for context, outcome in zip(contexts, outcomes):
            spoiled = any(c[0] in faulty for c in batch_of[context])
            if spoiled:
                assert isinstance(outcome, ValueError if how == "raise" else BackendError)
            else:
                np.testing.assert_allclose(outcome, lm.expected(context), atol=1e-6)
        lm.close()


class TestRaisingBackend:
    @pytest.mark.parametrize(
        "exc",
        [StopIteration, StopAsyncIteration, KeyboardInterrupt, SystemExit],
        ids=lambda e: e.__name__,
    )
    def test_untransportable_exception_fails_the_batch_and_the_model_serves_on(self, exc, lm):
        """The batch's waiters get BackendError (cause: the original), later requests
        work, and aclose() finishes: nothing hangs, nothing escapes the worker."""
        lm.fail_next_call(Fault(raises=exc))

        async def main():
            first = await asyncio.wait_for(
                asyncio.gather(
                    lm.next_token_logprobs([1]), lm.next_token_logprobs([2]), return_exceptions=True
                ),
                5,
            )
            later = await asyncio.wait_for(lm.next_token_logprobs([1]), 5)
            await asyncio.wait_for(lm.aclose(), 5)
            return first, later

        first, later = run(main())
        for outcome in first:
            assert isinstance(outcome, BackendError) and type(outcome.__cause__) is exc
        np.testing.assert_allclose(later, lm.expected((1,)), atol=1e-6)
        assert lm.released.is_set() and lm.worker.stopped.done()
        lm.worker._thread.join(5)
        assert not lm.worker._thread.is_alive()

    def test_sync_path_gets_backend_error_too(self, lm):
        """next_token_logprobs_sync over a StopIteration backend raises BackendError."""
        lm.fail_next_call(Fault(raises=StopIteration))
        with pytest.raises(BackendError):
            within(5, lm.next_token_logprobs_sync, [1])
        np.testing.assert_allclose(
            within(5, lm.next_token_logprobs_sync, [1]), lm.expected((1,)), atol=1e-6
        )


class TestClose:
    def test_sync_close_fails_requests_queued_behind_the_running_batch(self, blocked):
        """close() from another thread: the running batch delivers, the queued requests
        fail with ModelClosedError, none is left pending."""
        lm, gate = blocked
        lm.batcher.max_in_flight = 1  # no ready slot: what comes next stays queued

        async def main():
            running = await start_blocked_batch(lm)
            queued = [asyncio.ensure_future(lm.next_token_logprobs([i])) for i in (2, 3)]
            await asyncio.sleep(0.01)
            closer = threading.Thread(target=lm.close)
            closer.start()
            await until(lambda: lm._closed)  # set once the scheduler refuses requests
            gate.set()
            row = await asyncio.wait_for(running, 5)
            for request in queued:
                with pytest.raises(ModelClosedError):
                    await asyncio.wait_for(request, 5)
            closer.join(5)
            assert not closer.is_alive()
            return row

        np.testing.assert_allclose(run(main()), lm.expected((1,)), atol=1e-6)
        assert lm.batches == [[(1,)]] and lm.released.is_set()

    def test_close_lets_every_batch_handed_to_the_worker_deliver(self, blocked):
        """close() fails what is still queued in the scheduler, while every batch already
        handed to the worker delivers: the running one and the one waiting behind it (a
        loop hands over up to max_in_flight, two by default), then the release runs."""
        lm, gate = blocked

        async def main():
            running = await start_blocked_batch(lm)
            handed = asyncio.ensure_future(lm.next_token_logprobs([2]))
            await until(lambda: lm.worker._queue.qsize() == 1)  # waits behind the running one
            queued = asyncio.ensure_future(lm.next_token_logprobs([3]))  # no slot: stays queued
            await asyncio.sleep(0.01)
            closer = threading.Thread(target=lm.close)
            closer.start()
            await until(lambda: lm._closed)
            gate.set()
            rows = await asyncio.wait_for(asyncio.gather(running, handed), 5)
            with pytest.raises(ModelClosedError):
                await asyncio.wait_for(queued, 5)
            closer.join(5)
            assert not closer.is_alive()
            return rows

        for context, row in zip([(1,), (2,)], run(main())):
            np.testing.assert_allclose(row, lm.expected(context), atol=1e-6)
        assert lm.batches == [[(1,)], [(2,)]] and lm.released.is_set()

    def test_sync_close_on_the_loop_thread_fails_its_queued_requests(self, blocked):
        """close() called by a coroutine blocks its own loop until the release, then the
        loop's queued requests fail with ModelClosedError as soon as it resumes."""
        lm, gate = blocked
        lm.batcher.max_in_flight = 1  # no ready slot: what comes next stays queued

        async def main():
            running = await start_blocked_batch(lm)
            queued = asyncio.ensure_future(lm.next_token_logprobs([2]))
            await asyncio.sleep(0.01)
            opener = threading.Timer(0.05, gate.set)  # the loop is blocked in close()
            opener.start()
            lm.close()
            assert lm.released.is_set()
            with pytest.raises(ModelClosedError):
                await asyncio.wait_for(queued, 5)
            return await asyncio.wait_for(running, 5)

        np.testing.assert_allclose(run(main()), lm.expected((1,)), atol=1e-6)

    def test_cancelled_aclose_still_releases_the_backend(self, blocked):
        """aclose() cancelled while a batch runs: the backend is released and the worker
        stops once the batch ends, with no second call; a second aclose() returns."""
        lm, gate = blocked

        async def main():
            running = await start_blocked_batch(lm)
            await cancel_aclose(lm)
            assert not lm.released.is_set()
            gate.set()
            row = await asyncio.wait_for(running, 5)
            await until(lm.released.is_set)
            await until(lambda: not lm.worker._thread.is_alive())
            await asyncio.wait_for(lm.aclose(), 5)
            return row

        np.testing.assert_allclose(run(main()), lm.expected((1,)), atol=1e-6)
        assert lm.closes == 1

    @pytest.mark.parametrize("second", ["aclose", "close"])
    def test_second_close_after_a_cancelled_aclose_waits_for_the_release(self, blocked, second):
        """After a cancelled aclose(), a second aclose()/close() returns only once the
        backend is released and the worker stopped."""
        lm, gate = blocked

        async def main():
            running = await start_blocked_batch(lm)
            await cancel_aclose(lm)
            if second == "aclose":
                closing = asyncio.ensure_future(lm.aclose())
            else:
                closing = asyncio.ensure_future(asyncio.to_thread(lm.close))
            await asyncio.sleep(0.05)
            assert not closing.done()
            gate.set()
            await asyncio.wait_for(closing, 5)
            assert lm.released.is_set() and lm.worker.stopped.done()
            await running

        run(main())
        assert lm.closes == 1

    def test_close_is_idempotent_and_reraises_a_failed_release(self):
        """close()/aclose() release once; a failing release is raised to each caller."""
        lm = FaultyLM()
        lm.close_fault = Fault(raises=RuntimeError("release failed"))
        lm.next_token_logprobs_sync([1])
        with pytest.raises(RuntimeError, match="release failed"):
            lm.close()
        with pytest.raises(RuntimeError, match="release failed"):
            run(asyncio.wait_for(lm.aclose(), 5))
        assert lm.closes == 1
        with pytest.raises(ModelClosedError):
            lm.next_token_logprobs_sync([1])

    def test_no_batch_runs_after_the_backend_is_released(self, monkeypatch):
        """A blocking caller that is between two batches when close starts gets
        ModelClosedError for the next one: no batch runs on the released backend. close
        queued the release, then closed the worker in a second step, and a batch submitted
        between the two ran after the release (1 in 300 trials in the review). Here the
        caller's next batch is forced into that moment: its running batch is let go only
        once the worker's close is reached, and the close waits for the caller."""
        lm = FaultyLM(cache_bytes=0, max_batch_size=1)
        gate = threading.Event()
        lm.fail_next_call(Fault(block=gate))
        after_release: list[list[tuple[int, ...]]] = []
        run_batch = lm._logprobs_batch

        def recording(contexts, variant):
            if lm.released.is_set():
                after_release.append(list(contexts))
            return run_batch(contexts, variant)

        outcome: list[object] = []

        def caller() -> None:  # three batches of one context each, the first blocked
            try:
                outcome.append(lm.batch_next_token_logprobs_sync([[2], [3], [4]]))
            except ModelClosedError as exc:
                outcome.append(exc)

        close = lm.worker.close

        def close_once_the_caller_is_done(wait: bool = True) -> None:
            gate.set()
            thread.join(5)
            close(wait)

        monkeypatch.setattr(lm, "_logprobs_batch", recording)
        thread = threading.Thread(target=caller)
        thread.start()
        assert lm.started.wait(5)
        monkeypatch.setattr(lm.worker, "close", close_once_the_caller_is_done)
        lm.close()
        assert lm.released.is_set() and after_release == []
        assert len(outcome) == 1 and isinstance(outcome[0], ModelClosedError)

    def test_clear_cache_forgets_the_rows_of_the_running_batch(self, blocked):
        """The model changes while a batch runs, then clear_cache(): the running batch's
        rows still reach their waiter, but are not stored, so a request made after
        clear_cache() returned gets a row of the changed model (the stale row came back
        from the cache)."""
        lm, gate = blocked

        async def main():
            running = await start_blocked_batch(lm)
            lm.seed = 1  # the model changes ...
            loop = asyncio.get_running_loop()
            clearing = loop.run_in_executor(None, lm.clear_cache)  # ... and is cleared
            await until(lambda: lm.output_cache.generation == 1)
            gate.set()
            await asyncio.wait_for(clearing, 5)
            old = await running
            return old, await lm.next_token_logprobs([1])

        old, new = run(main())
        np.testing.assert_allclose(old, mock_logprobs((1,), 8, 0), atol=1e-6)
        np.testing.assert_allclose(new, mock_logprobs((1,), 8, 1), atol=1e-6)
        assert lm.batches == [[(1,)], [(1,)]]

    def test_clear_cache_forgets_the_rows_of_a_batch_handed_over_before_it(self):
        """A second batch, handed to the worker behind a running one, starts after
        clear_cache() began but still computes from the backend's old state (dropped only
        by _clear_backend_cache, queued behind it): its rows are not stored, so a request
        made after clear_cache() returned gets the changed model's row."""
        from genlm.core.mock import MockLM

        class StaleStateLM(MockLM):
            """Rows come from state (like KV) that only _clear_backend_cache refreshes from
            the current weights (``seed``)."""

            def __init__(self):
                super().__init__([bytes([i]) for i in range(8)])
                self.state_seed, self.gate, self.started = self.seed, threading.Event(), 0

            def _logprobs_batch(self, contexts, variant):
                self.started += 1
                if contexts == [(1,)]:
                    assert self.gate.wait(10)
                return np.stack([mock_logprobs(c, 8, self.state_seed) for c in contexts])

            def _clear_backend_cache(self):
                self.state_seed = self.seed

        lm = StaleStateLM()

        async def main():
            first = asyncio.ensure_future(lm.next_token_logprobs([1]))
            await until(lambda: lm.started == 1)  # runs, held on the worker
            second = asyncio.ensure_future(lm.next_token_logprobs([2]))
            await asyncio.sleep(0.05)  # handed to the worker behind the first
            lm.seed = 1  # the model changes ...
            loop = asyncio.get_running_loop()
            clearing = loop.run_in_executor(None, lm.clear_cache)  # ... and is cleared
            await until(lambda: lm.output_cache.generation == 1)
            lm.gate.set()
            await asyncio.wait_for(asyncio.gather(clearing, first, second), 5)
            return await lm.next_token_logprobs([2])

        try:
            row = run(main())
        finally:
            lm.gate.set()
            lm.close()
        np.testing.assert_allclose(row, mock_logprobs((2,), 8, 1), atol=1e-6)

    @pytest.mark.parametrize("clear_raises", [False, True])
    def test_a_request_after_clear_cache_never_joins_a_batch_in_flight(self, clear_raises):
        """clear_cache() on the event loop, after a model change, while a batch is in flight
        whose rows are not yet delivered: a request for the same context made after it
        returned is computed anew (it joined the in-flight computation of the old model).
        So it is when the backend's clear changes the state, then raises (clear_cache
        raises that error)."""
        from genlm.core.mock import MockLM

        class HalfClear(MockLM):
            def _clear_backend_cache(self):
                self.seed = 1
                raise RuntimeError("the backend's clear failed half way")

        lm = (HalfClear if clear_raises else MockLM)([bytes([i]) for i in range(8)])

        async def main():
            first = asyncio.ensure_future(lm.next_token_logprobs([1, 2]))
            await asyncio.sleep(0)  # it submits ...
            await asyncio.sleep(0)  # ... and its batch goes to the worker
            lm.worker.call(lambda: None)  # the loop blocked: computed, not yet delivered
            assert lm.batch_count == 1 and not first.done()
            if clear_raises:
                with pytest.raises(RuntimeError, match="half way"):
                    lm.clear_cache()
            else:
                lm.worker.call(setattr, lm, "seed", 1)  # the model changes on its thread ...
                lm.clear_cache()  # ... and is cleared, before the loop runs the delivery
            again = await lm.next_token_logprobs([1, 2])
            return await first, again

        try:
            old, new = run(main())
        finally:
            lm.close()
        np.testing.assert_allclose(old, mock_logprobs((1, 2), 8, 0), atol=1e-6)
        np.testing.assert_allclose(new, mock_logprobs((1, 2), 8, 1), atol=1e-6)
        assert lm.batch_count == 2

    def test_clear_cache_racing_close_does_not_raise(self, lm):
        """clear_cache() after close started is a no-op for the backend, not an error."""
        lm.next_token_logprobs_sync([1])
        lm.worker.close()  # the worker is gone, the model not yet marked closed
        lm.clear_cache()
        assert lm.clears == 0 and len(lm.output_cache) == 0

    def test_a_backend_closing_its_model_on_the_worker_empties_the_cache(self):
        """close() called by the backend on the worker thread returns without waiting for
        the release, and a closed model keeps no rows: the output cache is emptied and
        stores no more (it kept every row it held)."""
        from genlm.core.mock import MockLM

        class ClosesItself(MockLM):
            def _logprobs_batch(self, contexts, variant):
                if (5,) in contexts:
                    self.close()
                return super()._logprobs_batch(contexts, variant)

        lm = ClosesItself([bytes([i]) for i in range(8)])
        lm.next_token_logprobs_sync([1])
        assert len(lm.output_cache) == 1
        row = within(5, lm.next_token_logprobs_sync, [5])
        np.testing.assert_allclose(row, mock_logprobs((5,), 8), atol=1e-6)
        assert len(lm.output_cache) == 0 and lm.output_cache.max_bytes == 0
        with pytest.raises(ModelClosedError):
            lm.next_token_logprobs_sync([1])
        within(5, lm.close)


class TestInputValidation:
    @pytest.mark.parametrize(
        "context",
        [
            bytearray(b"\x01\x02"),
            memoryview(b"\x01\x02"),
            {1, 2},
            frozenset({1, 2}),
            {1: 0, 2: 0},
            {1: 0, 2: 0}.keys(),
        ],
        ids=["bytearray", "memoryview", "set", "frozenset", "dict", "dict_keys"],
    )
    def test_raw_bytes_and_unordered_contexts_are_rejected(self, context, lm):
        """Raw bytes and unordered collections are not contexts: InvalidContextError."""
        with pytest.raises(InvalidContextError, match="bytearray|memoryview|order"):
            lm.next_token_logprobs_sync(context)
        with pytest.raises(InvalidContextError):
            run(lm.next_token_logprobs(context))
        assert lm.batches == []

    @given(
        ids=st.lists(
            st.one_of(
                st.integers(-3, 2**18 + 3),
                st.booleans(),
                st.floats(0, 10),
                st.integers(0, 9).map(np.int64),
            ),
            min_size=1,
            max_size=12,
        ),
        vocab_size=st.sampled_from([1, 10, 2**18, 2**18 + 2]),
    )
    def test_validation_agrees_with_a_checker_written_plainly(self, ids, vocab_size):
        """Every id an int (numpy ints converted; bools and floats refused) in
        [0, vocab_size): accepted as a tuple of ints; else InvalidContextError."""
        expected = []
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                expected = None
                break
            if not 0 <= int(t) < vocab_size:
                expected = None
                break
            expected.append(int(t))
        for first_doubt in {_validation._first_doubt, None}:  # the C pass, then Python alone
            with mock.patch.object(_validation, "_first_doubt", first_doubt):
                if expected is None:
                    with pytest.raises(InvalidContextError, match="must be integers|out of range"):
                        validate_context(ids, vocab_size)
                else:
                    got = validate_context(ids, vocab_size)
                    assert got == tuple(expected) and all(type(t) is int for t in got)

    @given(
        contexts=st.lists(
            st.lists(st.one_of(st.integers(-1, 9), st.just(1.5)), max_size=5), max_size=4
        ),
        variant=st.sampled_from([None, "adapter"]),
    )
    def test_a_batch_is_validated_as_each_context_would_be(self, contexts, variant):
        """``validate_requests`` gives what ``validate_request`` gives each context, or
        raises what the first refused one raises, its index first (a variant the model
        lacks: its ValueError, even for no contexts)."""
        lm = FaultyLM(max_context_length=4)
        try:
            prefix = ""
            lm.validate_request([1], variant)  # the variant is checked first
            expected = []
            for i, context in enumerate(contexts):
                prefix = f"contexts[{i}]: "
                expected.append(lm.validate_request(context, variant))
        except (InvalidContextError, ValueError) as error:
            with pytest.raises(type(error)) as raised:
                lm.validate_requests(contexts, variant)
            assert str(raised.value) == prefix + str(error)
        else:
            assert lm.validate_requests(contexts, variant) == expected
        finally:
            lm.close()

    @given(
        ids=st.lists(
            st.one_of(
                st.integers(-(2**70), 2**70),
                st.integers(-2, 12),
                st.booleans(),
                st.floats(0, 10),
                st.integers(0, 9).map(np.int64),
                st.none(),
            ),
            max_size=12,
        ),
        vocab_size=st.sampled_from([0, 1, 10, 2**40]),
    )
    def test_the_c_pass_finds_the_first_doubtful_id(self, ids, vocab_size):
        """``first_doubt`` is the position of the first id that is not an exact int in
        range (or -1), as a plain loop finds it."""
        if _validation._first_doubt is None:
            pytest.skip("genlm.core._ids was not built here")
        expected = next(
            (i for i, t in enumerate(ids) if type(t) is not int or not 0 <= t < vocab_size), -1
        )
        ids = tuple(ids)  # new, so tracked by the collector (but for the empty singleton)
        assert _validation._first_doubt(ids, vocab_size) == expected
        if ids:  # a valid context is untracked, as the collector would; a doubtful one is left
            assert gc.is_tracked(ids) == (expected >= 0)

    @given(
        ids=st.lists(
            st.one_of(
                st.integers(-3, 12),
                st.integers(2**61 - 4, 2**61 + 2),
                st.integers(2**63 - 1, 2**64),
                st.booleans(),
                st.floats(0, 10),
                st.integers(0, 9).map(np.int64),
            ),
            max_size=6,
        ),
        as_tuple=st.booleans(),
        vocab_size=st.sampled_from([1, 10, 2**61 - 2, 2**61, 2**63 - 1]),
        variant=st.sampled_from([None, "adapter", ("lora", 2), -1]),
        max_length=st.sampled_from([1, 3, 100, 2**70]),
    )
    @example(ids=[1, 2], as_tuple=False, vocab_size=10, variant=None, max_length=3)
    @example(ids=[2**61 - 3], as_tuple=True, vocab_size=2**61 - 2, variant=-1, max_length=1)
    @example(ids=[2**61 - 3, 5], as_tuple=False, vocab_size=2**61, variant="adapter", max_length=3)
    def test_the_c_request_is_what_validation_makes(
        self, ids, as_tuple, vocab_size, variant, max_length
    ):
        """``make_request`` makes, for every valid list or tuple it is given, the request
        Python validation makes, with the hash of the tuple ``(variant, ids)``; it gives
        None (the Python path decides) exactly when the ids are not all exact ints in range,
        or not 1 to ``max_length`` of them."""
        if _model._make_request is None:
            pytest.skip("genlm.core._ids was not built here")
        context = tuple(ids) if as_tuple else list(ids)
        request = _model._make_request(variant, context, vocab_size, max_length)
        plain = all(type(t) is int and 0 <= t < vocab_size for t in ids)
        if not (plain and 1 <= len(ids) <= max_length):
            assert request is None
            return
        expected = Request(variant, validate_context(context, vocab_size))
        assert request == expected and request.ids == tuple(ids)
        assert hash(request) == hash(expected) == hash((variant, tuple(ids)))
        assert type(request.ids) is tuple and not gc.is_tracked(request.ids)

    def test_the_c_hash_is_cpythons_where_nox_runs(self):
        """The one-pass hash must agree with this CPython's tuple hash (checked when the
        module loads); else every request hashes through Python again, silently."""
        if not os.environ.get("GENLM_REQUIRE_TRIE_KERNEL"):
            pytest.skip("GENLM_REQUIRE_TRIE_KERNEL unset (the nox sessions set it)")
        from genlm.core import _ids

        assert _ids.FAST_HASH == 1

    def test_a_model_validates_alike_with_and_without_the_c_path(self):
        """The same requests, and the same errors, with ``make_request`` and without."""
        lm = FaultyLM(max_context_length=3)
        contexts = [[1, 2], (3,), [np.int64(2)], [1, 2, 3, 4], [], [True], "ab", [1.0], [99]]
        try:
            outcomes = []
            for make in (_model._make_request, None):
                with mock.patch.object(_model, "_make_request", make):
                    got = []
                    for context in contexts:
                        try:
                            got.append(lm.validate_request(context))
                        except InvalidContextError as error:
                            got.append(str(error))
                    got.append(lm.validate_requests(contexts[:3]))
                    outcomes.append(got)
            assert outcomes[0] == outcomes[1]
            assert sum(isinstance(o, str) for o in outcomes[0]) == 6  # the six bad contexts
        finally:
            lm.close()

    def test_the_c_pass_leaves_tuple_subclasses_tracked(self):
        """A subclass's instance may hold references besides its items: never untracked."""
        if _validation._first_doubt is None:
            pytest.skip("genlm.core._ids was not built here")

        class Ids(tuple):
            pass

        ids = Ids([1, 2])
        assert _validation._first_doubt(ids, 10) == -1 and gc.is_tracked(ids)

    def test_the_c_pass_is_built_where_nox_runs(self):
        """The nox sessions build genlm-core with a C compiler: the C pass must be there
        (else every request silently takes the slower Python checks)."""
        if not os.environ.get("GENLM_REQUIRE_TRIE_KERNEL"):
            pytest.skip("GENLM_REQUIRE_TRIE_KERNEL unset (the nox sessions set it)")
        assert _validation._first_doubt is not None

    @pytest.mark.parametrize(
        "context",
        [[1, 2], (1, 2), range(1, 3), np.array([1, 2], dtype=np.int32), (t for t in [1, 2])],
        ids=["list", "tuple", "range", "ndarray", "generator"],
    )
    def test_ordered_integer_sequences_are_accepted(self, context):
        """Ordered iterables of ints (numpy arrays included) are contexts."""
        assert validate_context(context, 8) == (1, 2)


class TestSamplingArguments:
    BAD = [
        ({"temperature": float("nan")}, ValueError),
        ({"temperature": float("inf")}, ValueError),
        ({"temperature": -1.0}, ValueError),
        ({"temperature": True}, TypeError),
        ({"temperature": "1"}, TypeError),
        ({"max_tokens": 2.5}, TypeError),
        ({"max_tokens": 3.0}, TypeError),
        ({"max_tokens": True}, TypeError),
        ({"max_tokens": -1}, ValueError),
        ({"temperature": 10**400}, ValueError),  # too large for a float: not OverflowError
        ({"temperature": -(10**400)}, ValueError),
    ]

    @pytest.mark.parametrize(("kwargs", "error"), BAD, ids=lambda v: str(v)[:40])
    def test_bad_arguments_raise_before_any_work(self, kwargs, error, lm):
        """sample and batch_sample reject bad max_tokens/temperature before a forward pass."""
        args = {"max_tokens": 3, "temperature": 1.0, "seed": 0} | kwargs
        with pytest.raises(error, match="max_tokens|temperature"):
            run(lm.sample([1], **args))
        with pytest.raises(error, match="max_tokens|temperature"):
            run(lm.batch_sample([[1], [2]], **args))
        assert lm.batches == []

    def test_numpy_integer_max_tokens_is_fine(self, lm):
        """max_tokens may be a numpy integer; exactly that many tokens come back."""
        tokens = run(lm.sample([1], max_tokens=np.int64(3), eos_token_ids=[], seed=0))
        assert len(tokens) == 3

    def test_batch_sample_checks_every_prompt_first(self, lm):
        """A bad prompt anywhere in batch_sample fails before any prompt is computed."""
        with pytest.raises(InvalidContextError):
            run(lm.batch_sample([[1], [99]], max_tokens=2, seed=0))
        assert lm.batches == []

    def test_batch_sample_reads_iterators_once(self):
        """A generator prompt and an iterator of EOS ids serve batch_sample as they serve
        sample (the prompts were validated twice, an emptied generator failing; the EOS
        ids were read for the first prompt only)."""
        from genlm.core.mock import MockLM

        lm = MockLM([bytes([b]) for b in range(8)])
        every = range(8)
        one = run(lm.sample((t for t in [1, 2]), max_tokens=5, eos_token_ids=every, seed=0))
        both = run(
            lm.batch_sample([(t for t in [1, 2]), [3]], 5, eos_token_ids=iter(every), seed=0)
        )
        assert len(one) == 1 and [len(tokens) for tokens in both] == [1, 1]  # all are EOS
        with pytest.raises(TypeError, match="eos_token_ids must be a list"):
            run(lm.sample([1], max_tokens=2, eos_token_ids=5))
        lm.close()

    def test_a_failing_prompt_stops_the_rest_of_batch_sample(self):
        """When one prompt's sampling fails, batch_sample cancels the others before it
        raises: no task of it is left and the backend gets no more calls (a bare gather
        left them sampling, 141 more forward passes in the review's run)."""

        class FailsOnThirdStep(FaultyLM):
            def _logprobs_batch(self, contexts, variant):
                if any(c[0] == 7 and len(c) == 3 for c in contexts):
                    raise RuntimeError("prompt 7's third step")
                return super()._logprobs_batch(contexts, variant)

        lm = FailsOnThirdStep(vocab_size=8, cache_bytes=0, max_batch_size=1)

        async def scenario():
            with pytest.raises(RuntimeError, match="third step"):
                await lm.batch_sample([[1], [2], [3], [7]], 50, eos_token_ids=[], seed=0)
            left = asyncio.all_tasks() - {asyncio.current_task()}
            calls = len(lm.batches)
            for _ in range(20):  # a task left behind would queue more batches meanwhile
                await asyncio.sleep(0.001)
            return left, len(lm.batches) - calls

        assert run(scenario()) == (set(), 0)
        lm.close()

    def test_sample_over_a_nan_row_raises_not_token_0(self, lm):
        """A NaN row from the backend makes sample raise BackendError, not return [0]."""
        lm.fail_context((1,), Fault(bad_row="nan"))
        with pytest.raises(BackendError, match="NaN"):
            run(lm.sample([1], max_tokens=1, seed=0))

    @pytest.mark.parametrize("temperature", [0.0, 1.0])
    @pytest.mark.parametrize(
        ("row", "says"),
        [
            ([np.nan, 0.0, -1.0], "NaN"),
            ([-1.0, np.inf, -2.0], r"\+inf"),
            ([-np.inf, -np.inf, -np.inf], "only -inf"),
        ],
    )
    def test_sample_token_rejects_rows_argmax_would_misread(self, row, says, temperature):
        """sample_token never answers token 0 for a NaN, +inf or all -inf row."""
        with pytest.raises(ValueError, match=says):
            sample_token(np.array(row), np.random.default_rng(0), temperature)

    def test_sample_token_refuses_anything_but_one_row(self):
        """A batch of rows is not read as one long row (argmax over the flattened array
        then indexed the 2-D one: an IndexError, or a wrong row's score)."""
        with pytest.raises(ValueError, match=r"shape \(2, 4\): one row"):
            sample_token(np.log(np.full((2, 4), 0.25)), np.random.default_rng(0))

    def test_sample_token_draws_follow_the_distribution(self):
        """Seeded Gumbel-max draws match the probabilities (chi-square style bound)."""
        logprobs = np.array([np.log(0.1), np.log(0.6), np.log(0.3), -np.inf])
        rng = np.random.default_rng(0)
        counts = np.bincount([sample_token(logprobs, rng) for _ in range(6000)], minlength=4)
        np.testing.assert_allclose(counts / 6000, [0.1, 0.6, 0.3, 0.0], atol=0.025)


# ---- random interleavings ---------------------------------------------------------------

MODEL_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("request"), st.integers(0, 7)),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("yield"), st.integers(0, 3)),
        st.tuples(st.just("block"), st.just(0)),
        st.tuples(st.just("release"), st.just(0)),
        st.tuples(st.just("close"), st.sampled_from(["aclose", "cancelled aclose", "sync"])),
    ),
    max_size=30,
)


@settings(max_examples=30, deadline=None)
@given(ops=MODEL_OPS, batch_size=st.integers(1, 4))
@example(  # aclose cancelled while a batch runs, then the batch ends (item 8)
    ops=[("block", 0), ("request", 1), ("yield", 2), ("close", "cancelled aclose")],
    batch_size=1,
)
@example(  # sync close while requests wait behind a running batch (item 7)
    ops=[
        ("block", 0),
        ("request", 1),
        ("yield", 2),
        ("request", 2),
        ("close", "sync"),
        ("yield", 3),
        ("release", 0),
    ],
    batch_size=2,
)
def test_random_request_cancel_close_interleavings(ops, batch_size):
    """Any interleaving of requests, cancellations, blocked batches and (cancelled, sync
    or awaited) closes settles: each request gets its exact row, is cancelled, or fails
    with ModelClosedError; the backend is released exactly once; nothing hangs."""
    lm = FaultyLM(max_batch_size=batch_size)
    gate = threading.Event()

    async def main():
        requests, closers = [], []
        for op, arg in ops:
            if op == "request":
                requests.append((arg, asyncio.ensure_future(lm.next_token_logprobs([arg]))))
            elif op == "cancel" and requests:
                requests[arg % len(requests)][1].cancel()
            elif op == "yield":
                await asyncio.sleep(0.001 * arg)
            elif op == "block":
                lm.fail_next_call(Fault(block=gate))
            elif op == "release":
                gate.set()
            elif arg == "aclose":
                gate.set()
                await asyncio.wait_for(lm.aclose(), 5)
            elif arg == "cancelled aclose":
                try:
                    await asyncio.wait_for(lm.aclose(), 0.001)
                except TimeoutError:
                    pass
            else:
                closers.append(asyncio.ensure_future(asyncio.to_thread(lm.close)))
        gate.set()
        await asyncio.wait_for(lm.aclose(), 5)
        await asyncio.wait_for(asyncio.gather(*closers), 5)
        if requests:
            _, pending = await asyncio.wait([r for _, r in requests], timeout=5)
            assert not pending
        for context, request in requests:
            if request.cancelled():
                continue
            if request.exception() is None:
                np.testing.assert_allclose(request.result(), lm.expected((context,)), atol=1e-6)
            else:
                assert isinstance(request.exception(), ModelClosedError)

    run(main())
    assert lm.closes == 1 and lm.released.is_set()
    lm.worker._thread.join(5)
    assert not lm.worker._thread.is_alive()


def test_faulty_lm_variants_form_separate_batches():
    """FaultyLM's variant is captured per request; a batch never mixes variants."""
    lm = FaultyLM(cache_bytes=0)

    async def main():
        first = asyncio.ensure_future(lm.next_token_logprobs([1]))
        await asyncio.sleep(0)  # the first request is made (and its variant captured)
        lm.variant = "B"
        second = asyncio.ensure_future(lm.next_token_logprobs([2]))
        return await asyncio.gather(first, second)

    rows = run(main())
    assert sorted(map(repr, zip(lm.batch_variants, lm.batches))) == sorted(
        map(repr, [(None, [(1,)]), ("B", [(2,)])])
    )
    np.testing.assert_allclose(rows[1], lm.expected((2,)), atol=1e-6)
    lm.close()


class TestConstructorArguments:
    """Bad options fail when the model is made, not at every request."""

    @pytest.mark.parametrize(
        ("kwargs", "says"),
        [
            ({"max_wait_s": float("nan")}, "max_wait_s must be finite"),  # requests hung
            ({"max_wait_s": float("inf")}, "max_wait_s must be finite"),
            ({"cache_bytes": float("nan")}, "cache_bytes must be an integer"),  # cache was off
            ({"cache_bytes": 2.5}, "cache_bytes must be an integer"),
            ({"cache_bytes": float("inf")}, "cache_bytes must be an integer"),
            ({"cache_bytes": True}, "cache_bytes must be an integer"),
            ({"cache_bytes": -1}, "cache_bytes must be >= 0"),
            ({"max_batch_size": 2.5}, "max_batch_size must be an integer"),  # batches of 3
            ({"max_batch_size": float("nan")}, "max_batch_size must be an integer"),  # hung
            ({"max_batch_size": True}, "max_batch_size must be an integer"),
            ({"max_wait_s": True}, "max_wait_s must be a number of seconds"),  # a 1 s wait
            ({"max_context_length": 2.5}, "max_context_length must be an integer"),
            ({"max_context_length": True}, "max_context_length must be an integer"),
            ({"latency_s": -1}, "latency_s must be finite"),
            ({"seed": 2**64}, "seed must fit in 64 bits"),
            ({"seed": 1.5}, "seed must be an integer"),
        ],
    )
    def test_bad_options_are_refused_when_made(self, kwargs, says):
        from genlm.core.mock import MockLM

        with pytest.raises((TypeError, ValueError), match=says):
            MockLM([b"a", b"b"], **kwargs)

    def test_a_ragged_backend_batch_is_a_backend_error(self):
        """Rows numpy cannot stack are the backend's fault: BackendError, not the
        ValueError an InvalidContextError caller would take for bad input."""
        from genlm.core.mock import MockLM

        class Ragged(MockLM):
            def _logprobs_batch(self, contexts, variant):
                return [np.zeros(2), np.zeros(3)][: len(contexts)]

        lm = Ragged([b"a", b"b"], cache_bytes=0)
        with pytest.raises(BackendError, match="cannot stack"):
            lm.batch_next_token_logprobs_sync([[0], [1]])
        lm.close()

    @pytest.mark.parametrize("contexts", [{(0,), (1,)}, {(0,): 1, (1,): 2}, 5, None])
    def test_a_batch_of_contexts_must_be_ordered(self, contexts):
        """Row i answers contexts[i], so a set or dict of contexts is refused, and so is
        something that is not a collection at all (it was a bare "not iterable")."""
        from genlm.core.mock import MockLM

        lm = MockLM([b"a", b"b"])
        with pytest.raises(TypeError, match="contexts must be an ordered sequence"):
            lm.batch_next_token_logprobs_sync(contexts)
        with pytest.raises(TypeError, match="contexts must be an ordered sequence"):
            run(lm.batch_next_token_logprobs(contexts))
        lm.close()

    @pytest.mark.parametrize(
        ("bad", "says"), [([True], "is True"), ([5], "id 5"), ([], "empty"), ([[0]], "nested|int")]
    )
    def test_a_bad_context_of_a_batch_is_named_by_its_index(self, bad, says):
        """Which context of a batch call is bad: its index leads the message, whichever
        path (the C check or Python's) found it."""
        from genlm.core.mock import MockLM

        lm = MockLM([b"a", b"b"])
        contexts = [[0], (1, 0), bad, [1]]
        with pytest.raises(InvalidContextError, match=rf"^contexts\[2\]: .*({says})"):
            lm.batch_next_token_logprobs_sync(contexts)
        with pytest.raises(InvalidContextError, match=rf"^contexts\[2\]: .*({says})"):
            run(lm.batch_next_token_logprobs(contexts))
        assert lm.batches == []  # every context is checked before any is computed
        lm.close()
