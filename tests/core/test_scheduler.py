"""The autobatching scheduler: batching, dedup, firing, fan-out, cancellation, shutdown."""

import asyncio
import gc
import re
import threading
import time
import warnings
import weakref

import numpy as np
import pytest

from genlm.core import BackendError, ModelClosedError
from genlm.core.backend import AutoBatcher, ModelWorker, Requeue
from genlm.core.mock import MockLM, mock_logprobs

VOCAB = [bytes([b]) for b in range(32)]


def run(coro):
    return asyncio.run(coro)


class TestBatching:
    def test_concurrent_requests_form_one_batch(self):
        """Requests awaited together reach the backend as one batch."""
        lm = MockLM(VOCAB, cache_bytes=0)

        async def main():
            return await asyncio.gather(*(lm.next_token_logprobs([i, 1]) for i in range(10)))

        rows = run(main())
        assert [len(b) for b in lm.batches] == [10]
        for i, row in enumerate(rows):
            np.testing.assert_allclose(row, mock_logprobs((i, 1), 32), atol=1e-6)
        lm.close()

    def test_identical_contexts_are_computed_once(self):
        """Duplicate contexts in flight share one computation and one result."""
        lm = MockLM(VOCAB, cache_bytes=0)

        async def main():
            return await asyncio.gather(*(lm.next_token_logprobs([i % 3]) for i in range(30)))

        rows = run(main())
        assert sorted(lm.batches[0]) == [(0,), (1,), (2,)]
        assert sum(len(b) for b in lm.batches) == 3
        for i, row in enumerate(rows):
            np.testing.assert_array_equal(row, rows[i % 3])
        lm.close()

    def test_batches_never_exceed_max_batch_size(self):
        """70 distinct requests with max_batch_size 32 run as batches of at most 32."""
        lm = MockLM(VOCAB, cache_bytes=0, max_batch_size=32)

        async def main():
            await asyncio.gather(*(lm.next_token_logprobs([i % 32, i // 32]) for i in range(70)))

        run(main())
        sizes = [len(b) for b in lm.batches]
        assert max(sizes) <= 32 and sum(sizes) == 70
        assert len({c for b in lm.batches for c in b}) == 70
        lm.close()

    def test_wait_is_bounded_from_the_first_request(self):
        """A steady stream of arrivals never postpones the first queued request."""
        lm = MockLM(VOCAB, cache_bytes=0, max_batch_size=1000, max_wait_s=0.05)

        async def main():
            first = asyncio.ensure_future(lm.next_token_logprobs([0]))
            others = []
            start = time.monotonic()
            done_at = None
            for i in range(60):  # one new request every 10 ms for 0.6 s
                await asyncio.sleep(0.01)
                others.append(asyncio.ensure_future(lm.next_token_logprobs([1, i % 32, i // 32])))
                if done_at is None and first.done():
                    done_at = time.monotonic() - start
            await asyncio.gather(first, *others)
            return done_at

        done_at = run(main())
        assert done_at is not None and done_at < 0.4
        lm.close()

    def test_event_loop_runs_during_a_forward_pass(self):
        """A slow backend runs on the worker thread while other coroutines keep running."""
        lm = MockLM(VOCAB, latency_s=0.3, cache_bytes=0)
        threads = []
        original = lm._logprobs_batch

        def spy(contexts, variant):
            threads.append(threading.current_thread())
            return original(contexts, variant)

        lm._logprobs_batch = spy

        async def main():
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            task = asyncio.ensure_future(ticker())
            await lm.next_token_logprobs([1, 2, 3])
            task.cancel()
            return ticks

        assert run(main()) >= 10
        assert threads == [lm.worker._thread] and threads[0] is not threading.main_thread()
        lm.close()

    def test_variants_are_never_mixed_in_a_batch(self):
        """Requests made under different variants (adapters) go to separate batches."""
        lm = MockLM(VOCAB, cache_bytes=0)
        seen = []
        original = lm._logprobs_batch

        def spy(contexts, variant):
            seen.append((variant, len(contexts)))
            return original(contexts, variant)

        lm._logprobs_batch = spy

        async def main():
            futures = []
            for variant in ["a", "b", "a", "b", None]:
                lm._variant = lambda v=variant: v
                futures.append(asyncio.ensure_future(lm.next_token_logprobs([5])))
                await asyncio.sleep(0)  # the request is made (and its variant captured) now
            return await asyncio.gather(*futures)

        run(main())
        assert sorted(seen, key=str) == sorted([("a", 1), ("b", 1), (None, 1)], key=str)
        lm.close()


class TestFailures:
    def test_batch_exception_reaches_every_waiter_and_the_model_recovers(self):
        """A backend error fails each request of that batch; the next batch works."""
        lm = MockLM(VOCAB, cache_bytes=0)
        original = lm._logprobs_batch
        calls = []

        def flaky(contexts, variant):
            calls.append(len(contexts))
            if len(calls) == 1:
                raise RuntimeError("device fell over")
            return original(contexts, variant)

        lm._logprobs_batch = flaky

        async def main():
            first = await asyncio.gather(
                *(lm.next_token_logprobs([i]) for i in range(4)), return_exceptions=True
            )
            second = await lm.next_token_logprobs([0])
            return first, second

        first, second = run(main())
        assert all(isinstance(e, RuntimeError) and "fell over" in str(e) for e in first)
        np.testing.assert_allclose(second, mock_logprobs((0,), 32), atol=1e-6)
        lm.close()

    def test_wrong_shape_from_backend_is_reported(self):
        """A backend returning the wrong shape gets a clear error naming both shapes."""
        lm = MockLM(VOCAB, cache_bytes=0)
        lm._logprobs_batch = lambda contexts, variant: np.zeros((len(contexts), 3))
        with pytest.raises(RuntimeError, match=r"shape \(1, 3\).*\(1, 32\)"):
            lm.next_token_logprobs_sync([1])
        lm.close()

    @pytest.mark.parametrize(
        ("change", "returned"),
        [("pop", "(1, 32)"), ("pad", "(4, 32)")],
    )
    def test_a_batch_is_checked_as_handed_over(self, change, returned):
        """The backend may change the list of contexts it gets; its rows are still checked
        against the batch core handed over: a context popped (one row short) or padded in
        place (a row per padding) is a BackendError naming the backend and both shapes,
        where the changed list's length was taken as the batch's."""

        class Changes(MockLM):
            def _logprobs_batch(self, contexts, variant):
                if change == "pop":
                    contexts.pop()
                while len(contexts) < 4 and change == "pad":
                    contexts.append(contexts[-1])
                return super()._logprobs_batch(contexts, variant)

        lm = Changes(VOCAB, cache_bytes=0, name="changer")
        with pytest.raises(BackendError, match=rf"Changes 'changer'.*{re.escape(returned)}"):
            lm.batch_next_token_logprobs_sync([[1], [2]])
        lm.close()

    def test_a_backend_may_pad_its_list_in_place(self):
        """Padding the list core passes, then returning the real contexts' rows, is
        allowed: each context gets its own row."""

        class Pads(MockLM):
            def _logprobs_batch(self, contexts, variant):
                real = len(contexts)
                contexts.extend([contexts[-1]] * (4 - real))
                return super()._logprobs_batch(contexts, variant)[:real]

        lm = Pads(VOCAB, cache_bytes=0)
        rows = lm.batch_next_token_logprobs_sync([[1], [2, 3]])
        np.testing.assert_allclose(rows[0], mock_logprobs((1,), 32), atol=1e-6)
        np.testing.assert_allclose(rows[1], mock_logprobs((2, 3), 32), atol=1e-6)
        lm.close()

    def test_items_whose_waiters_all_cancelled_are_dropped(self):
        """A queued request nobody waits for any more is not computed."""
        lm = MockLM(VOCAB, cache_bytes=0, max_wait_s=0.05)

        async def main():
            doomed = asyncio.ensure_future(lm.next_token_logprobs([7, 7]))
            kept = asyncio.ensure_future(lm.next_token_logprobs([8]))
            await asyncio.sleep(0)
            doomed.cancel()
            await kept

        run(main())
        assert lm.batches == [[(8,)]]
        lm.close()


class TestLifecycle:
    def test_model_serves_successive_event_loops(self):
        """One model answers in several asyncio.run calls (state is per event loop)."""
        lm = MockLM(VOCAB, cache_bytes=0)
        for i in range(3):
            row = run(lm.next_token_logprobs([i]))
            np.testing.assert_allclose(row, mock_logprobs((i,), 32), atol=1e-6)
        lm.close()

    def test_aclose_fails_queued_requests_and_leaves_nothing_pending(self, recwarn):
        """aclose() fails queued requests, stops the worker, and leaves no task or timer."""
        lm = MockLM(VOCAB, cache_bytes=0, max_wait_s=10.0)

        async def main():
            queued = asyncio.ensure_future(lm.next_token_logprobs([3]))
            await asyncio.sleep(0)
            await lm.aclose()
            with pytest.raises(ModelClosedError):
                await queued
            with pytest.raises(ModelClosedError):
                await lm.next_token_logprobs([3])
            assert asyncio.all_tasks() == {asyncio.current_task()}
            for state in lm.batcher._states.values():
                assert state.timer is None and not state.queues and not state.entries

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            run(main())
            gc.collect()
        lm.worker._thread.join(timeout=5)
        assert not lm.worker._thread.is_alive()

    def test_aclose_waits_for_the_running_batch(self):
        """A batch already running when aclose() is called still delivers its result."""
        lm = MockLM(VOCAB, cache_bytes=0, latency_s=0.2)

        async def main():
            running = asyncio.ensure_future(lm.next_token_logprobs([4]))
            await asyncio.sleep(0.05)
            await lm.aclose()
            return await running

        np.testing.assert_allclose(run(main()), mock_logprobs((4,), 32), atol=1e-6)

    @pytest.mark.parametrize("how", ["close", "aclose"])
    def test_a_closed_model_keeps_no_rows_of_a_batch_running_at_close(self, how):
        """A batch running when the model closes still answers its caller, but its rows
        are not stored in the (emptied) output cache afterwards."""
        lm = MockLM(VOCAB, latency_s=0.2)

        started, closed = threading.Event(), threading.Event()

        async def request():
            running = asyncio.ensure_future(lm.next_token_logprobs([4]))
            await asyncio.sleep(0.05)  # the batch is on the worker
            started.set()
            if how == "close":
                lm.close()  # on this loop's thread: the hand-back runs after it returns
            else:
                closed.wait(5)  # this loop is busy until aclose (on another loop) returns
            return await running

        if how == "close":
            row = run(request())
        else:  # aclose on another loop, which does not wait for this loop's batch
            rows = []
            thread = threading.Thread(target=lambda: rows.append(run(request())))
            thread.start()
            started.wait(5)
            run(lm.aclose())
            closed.set()
            thread.join(5)
            (row,) = rows
        np.testing.assert_allclose(row, mock_logprobs((4,), 32), atol=1e-6)
        assert len(lm.output_cache) == 0 and lm.output_cache.nbytes == 0

    def test_async_context_manager_closes(self):
        """`async with model` closes it on exit."""

        async def main():
            async with MockLM(VOCAB) as lm:
                await lm.next_token_logprobs([1])
            return lm

        lm = run(main())
        with pytest.raises(ModelClosedError):
            lm.next_token_logprobs_sync([1])


class TestAutoBatcherDirectly:
    def test_without_keys_nothing_is_deduplicated(self):
        """With key=None every submitted item is computed, in submission order."""
        worker = ModelWorker("test")
        seen = []

        def double(items):
            seen.append(list(items))
            return [2 * x for x in items]

        batcher = AutoBatcher(double, worker, max_batch_size=8)

        async def main():
            return await asyncio.gather(*(batcher.submit(x) for x in [1, 1, 2, 3]))

        assert run(main()) == [2, 2, 4, 6]
        assert seen == [[1, 1, 2, 3]]
        worker.close()

    def test_a_wrong_number_of_results_is_a_backend_error_naming_run_batch(self):
        """run_batch returning another count than it got items fails the batch's waiters
        with a BackendError naming it (it was a bare RuntimeError)."""
        worker = ModelWorker("test")

        def drops_one(items):
            return items[:-1]

        batcher = AutoBatcher(drops_one, worker)

        async def main():
            return await asyncio.gather(*(batcher.submit(x) for x in [1, 2]))

        with pytest.raises(BackendError, match=r"drops_one returned 1 results for a batch of 2"):
            run(main())
        worker.close()

    def test_a_run_that_requeues_lets_another_batch_through_then_delivers(self):
        """run_batch returning Requeue: a batch of another batcher on the same worker runs
        in between, the first batch's waiters get the last part's results (checked for
        their count, as a plain run's), and run_sync takes the same path."""
        worker = ModelWorker("test")
        log, gate = [], threading.Event()

        def in_two_parts(items):
            gate.wait(5)
            log.append(("first part", list(items)))

            def rest(keep):
                log.append(("rest", list(items)))
                return [10 * x for x in items][:keep]

            return Requeue(rest, (len(items),))

        def quick(items):
            log.append(("quick", list(items)))
            return items

        slow, fast = AutoBatcher(in_two_parts, worker), AutoBatcher(quick, worker)

        async def main():
            first = asyncio.gather(*(slow.submit(x) for x in [1, 2]))
            await asyncio.sleep(0)  # the slow batch is handed to the worker first
            second = asyncio.gather(fast.submit(7))
            await asyncio.sleep(0)
            gate.set()
            return await asyncio.wait_for(asyncio.gather(first, second), 5)

        assert run(main()) == [[10, 20], [7]]
        assert log == [("first part", [1, 2]), ("quick", [7]), ("rest", [1, 2])]
        assert slow.run_sync([3]) == [30]

        def short_rest(items):
            return Requeue(lambda: items[:-1])

        with pytest.raises(BackendError, match="short_rest returned 1 results for a batch of 2"):
            AutoBatcher(short_rest, worker).run_sync([1, 2])
        worker.close()

    def test_aclose_waits_for_every_running_batch_and_a_cancelled_one_leaves_the_rest(self, gated):
        """Two aclose() calls wait for both in-flight batches; cancelling one of them does
        not wake the other before the batches finish, and a later aclose() returns at once."""
        gate, batcher = gated(max_batch_size=1, key=lambda item: item)

        async def main():
            waiters = batcher.submit_many([1, 2])
            await until(lambda: gate.started == 1)
            first = asyncio.ensure_future(batcher.aclose())
            second = asyncio.ensure_future(batcher.aclose())
            await asyncio.sleep(0.05)
            first.cancel()
            await asyncio.sleep(0.05)
            assert not second.done()  # the batches still run
            gate.open()
            await asyncio.wait_for(second, 5)
            assert all(waiter.done() for waiter in waiters)  # resolved before aclose returned
            assert first.cancelled()
            await asyncio.wait_for(batcher.aclose(), 5)
            return [waiter.result() for waiter in waiters]

        assert run(main()) == [("r", 1), ("r", 2)]
        assert gate.batches == [[1], [2]]

    def test_bad_arguments_are_rejected(self):
        """A non-positive batch size or negative wait is a clear ValueError; a value of
        the wrong type (a fractional or NaN batch size, a bool, a string) a TypeError
        naming the option, when the batcher is made or the option set later. A NaN batch
        size or in-flight limit used to be accepted and left every request waiting."""
        worker = ModelWorker("test")
        with pytest.raises(ValueError, match="max_batch_size"):
            AutoBatcher(list, worker, max_batch_size=0)
        with pytest.raises(ValueError, match="max_wait_s"):
            AutoBatcher(list, worker, max_wait_s=-1)
        for option, bad in [
            ("max_batch_size", 2.5),
            ("max_batch_size", float("nan")),
            ("max_batch_size", True),
            ("max_batch_size", "3"),
            ("max_in_flight", float("nan")),
            ("max_in_flight", 1.5),
            ("max_wait_s", True),
            ("max_wait_s", "0.1"),
        ]:
            with pytest.raises(TypeError, match=option):
                AutoBatcher(list, worker, **{option: bad})
        for option, bad in [("max_wait_s", float("nan")), ("max_wait_s", float("inf"))]:
            with pytest.raises(ValueError, match=option):
                AutoBatcher(list, worker, **{option: bad})
        batcher = AutoBatcher(list, worker, max_batch_size=np.int64(4), max_wait_s=np.float32(0))
        assert type(batcher.max_batch_size) is int and type(batcher.max_wait_s) is float
        for option, bad, error in [
            ("max_batch_size", 0, ValueError),
            ("max_batch_size", 2.5, TypeError),
            ("max_in_flight", 0, ValueError),
            ("max_wait_s", -1.0, ValueError),
        ]:
            with pytest.raises(error, match=option):
                setattr(batcher, option, bad)
        assert (batcher.max_batch_size, batcher.max_in_flight, batcher.max_wait_s) == (4, 2, 0.0)
        worker.close()


@pytest.fixture
def gated():
    """``make(**options) -> (gate, batcher)``: an AutoBatcher over a shut :class:`Gate` on
    a worker of its own, closed when the test ends."""
    workers = []

    def make(**options):
        gate = Gate(shut=True)
        workers.append(ModelWorker("test"))
        return gate, AutoBatcher(gate, workers[-1], **options)

    yield make
    for worker in workers:
        worker.close()


class Gate:
    """A test backend that doubles items, records each batch, and can be held shut.

    While shut, a batch waits on the worker thread until :meth:`open`; ``started`` counts
    the batches the worker has begun.
    """

    def __init__(self, shut: bool = False):
        self.batches: list[list] = []
        self.started = 0
        self._open = threading.Event()
        if not shut:
            self._open.set()

    def __call__(self, items):
        self.started += 1
        self.batches.append(list(items))
        assert self._open.wait(10), "the test never opened the gate"
        return [("r", item) for item in items]

    def open(self) -> None:
        self._open.set()


async def until(condition, timeout_s: float = 5.0) -> None:
    """Yield to the loop until ``condition()`` holds; fail instead of hanging."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.001)


def blocking_until(condition, timeout_s: float = 5.0) -> None:
    """Block the calling thread (and its loop) until ``condition()`` holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.001)


class TestEventLoops:
    def test_states_of_finished_loops_are_freed(self):
        """300 asyncio.run calls leave no event loop alive and no per-loop state behind."""
        worker = ModelWorker("test")
        batcher = AutoBatcher(lambda items: [2 * x for x in items], worker, max_wait_s=0.0)
        loops = []

        async def one(i):
            loops.append(weakref.ref(asyncio.get_running_loop()))
            return await batcher.submit(i)

        assert [run(one(i)) for i in range(300)] == [2 * i for i in range(300)]
        worker.call(lambda: None)  # the worker thread forgets the last batch's callback
        gc.collect()
        assert sum(ref() is not None for ref in loops) == 0
        assert len(batcher._states) == 0
        worker.close()

    def test_loops_that_end_with_work_queued_or_running_are_freed(self, gated):
        """A loop that ends with a request still queued, or its batch still running, is freed."""
        gate, batcher = gated(max_batch_size=1, max_wait_s=60.0)
        loops = []

        async def abandon(item):
            loops.append(weakref.ref(asyncio.get_running_loop()))
            batcher.submit(item)
            await asyncio.sleep(0)

        for i in range(2):
            run(abandon(i))  # batch size 1: each runs at once, held at the gate
        batcher.max_batch_size = 8
        for i in range(2, 5):
            run(abandon(i))  # waits 60 s for company: still queued when its loop ends
        gate.open()
        batcher.worker.call(lambda: None)  # the worker has finished everything it was given
        gc.collect()
        assert sum(ref() is not None for ref in loops) == 0
        assert len(batcher._states) == 0

    def test_aclose_fails_another_loops_requests_on_that_loops_thread(self):
        """aclose() on loop A fails loop B's queued requests from B's own thread."""
        worker = ModelWorker("test")
        batcher = AutoBatcher(Gate(), worker, max_wait_s=60.0)
        loop_b = asyncio.new_event_loop()
        loop_b.set_debug(True)  # asyncio then refuses calls from the wrong thread
        thread_b = threading.Thread(target=loop_b.run_forever)
        thread_b.start()
        try:

            async def wait_on_b():
                waiter = batcher.submit(1)
                try:
                    await asyncio.wait_for(waiter, 5)
                except ModelClosedError:
                    states = batcher._states.values()
                    return threading.current_thread(), [s.timer for s in states if s.timer]

            outcome = asyncio.run_coroutine_threadsafe(wait_on_b(), loop_b)
            blocking_until(lambda: len(batcher._states) == 1)
            run(batcher.aclose())
            failed_on, timers = outcome.result(timeout=5)
            assert failed_on is thread_b and timers == []
        finally:
            loop_b.call_soon_threadsafe(loop_b.stop)
            thread_b.join(5)
            loop_b.close()
        worker.close()

    def test_sync_close_fails_queued_requests_of_a_running_loop(self):
        """reject_new() from a thread without a loop fails loop B's queued request at once."""
        worker = ModelWorker("test")
        batcher = AutoBatcher(Gate(), worker, max_wait_s=60.0)
        loop_b = asyncio.new_event_loop()
        thread_b = threading.Thread(target=loop_b.run_forever)
        thread_b.start()
        try:

            async def wait_on_b():
                with pytest.raises(ModelClosedError):
                    await asyncio.wait_for(batcher.submit(1), 5)

            outcome = asyncio.run_coroutine_threadsafe(wait_on_b(), loop_b)
            blocking_until(lambda: len(batcher._states) == 1)
            batcher.reject_new()
            outcome.result(timeout=10)
        finally:
            loop_b.call_soon_threadsafe(loop_b.stop)
            thread_b.join(5)
            loop_b.close()
        worker.close()

    def test_aclose_with_a_closed_loop_still_holding_a_batch(self, gated):
        """A loop closed while its batch runs does not stop another loop's aclose()."""
        gate, batcher = gated(max_batch_size=1)

        async def abandon():
            batcher.submit(1)
            await asyncio.sleep(0)

        run(abandon())

        async def close():
            await batcher.aclose()
            gate.open()

        run(asyncio.wait_for(close(), 5))


class TestCloseRaces:
    def test_the_first_request_of_a_loop_racing_close_raises(self):
        """close() on another thread between submit's start and its loop's registration:
        the request raises ModelClosedError instead of waiting forever (issue #21)."""
        lm = MockLM(VOCAB, cache_bytes=0)
        register = lm.batcher._state

        def close_then_register(loop):
            closer = threading.Thread(target=lm.close)
            closer.start()
            closer.join(5)
            assert not closer.is_alive()
            return register(loop)

        lm.batcher._state = close_then_register

        async def main():
            with pytest.raises(ModelClosedError):
                await asyncio.wait_for(lm.next_token_logprobs([1]), 5)

        run(main())


class TestFairness:
    def test_a_full_group_does_not_wait_behind_another_groups_timer(self):
        """A full batch of group B runs at once although one group-A request waits 60 s."""
        worker = ModelWorker("test")
        batcher = AutoBatcher(
            Gate(), worker, max_batch_size=4, max_wait_s=60.0, group=lambda item: item[0]
        )

        async def main():
            lonely = batcher.submit(("A", 0))
            full = [batcher.submit(("B", i)) for i in range(4)]
            results = await asyncio.wait_for(asyncio.gather(*full), 5)
            assert results == [("r", ("B", i)) for i in range(4)]
            assert not lonely.done()  # still waiting for company, as it should
            await batcher.aclose()
            with pytest.raises(ModelClosedError):
                await lonely

        run(main())
        worker.close()

    def test_groups_fire_oldest_first(self, gated):
        """When the worker frees up, the group holding the oldest live request goes next."""
        gate, batcher = gated(
            max_batch_size=3, max_wait_s=0.0, group=lambda item: item[0], max_in_flight=1
        )

        async def main():
            first = batcher.submit(("X", 0))
            await until(lambda: gate.started == 1)
            gone = batcher.submit(("A", 0))  # group A is queued first ...
            waiters = [batcher.submit(("B", 0)), batcher.submit(("A", 1))]
            gone.cancel()  # ... but its oldest live request is younger than B's
            gate.open()
            await asyncio.wait_for(asyncio.gather(first, *waiters), 5)

        run(main())
        assert gate.batches == [[("X", 0)], [("B", 0)], [("A", 1)]]

    def test_a_younger_full_batch_does_not_take_the_slot_of_an_older_partial_one(self):
        """Group B's lone request waits for the worker's only slot. The running batch
        ends in the same loop iteration in which requests arrive that fill a batch of
        group A: the freed slot still goes to B, whose request is older."""
        worker, batcher, batches = _posting_batcher(max_batch_size=2)

        async def main():
            first = batcher.submit_many(["A0", "A1"])  # full: fires now
            lone = batcher.submit("B0")
            await asyncio.sleep(0)  # its flush ran and found no room

            async def client():
                return await batcher.submit("A3")  # completes A's next batch

            worker.finish_one()  # ready: the batch's end,
            other = asyncio.ensure_future(client())  # then the client,
            younger = batcher.submit("A2")  # then the flush this request scheduled
            while worker.pending or not other.done():
                await asyncio.sleep(0)
                if worker.pending:
                    worker.finish_one()
            await asyncio.gather(*first, lone, younger, other)

        run(main())
        assert batches == [["A0", "A1"], ["B0"], ["A2", "A3"]]


class _PostingWorker:
    """A stand-in worker: batches handed over wait in :attr:`pending` until
    :meth:`finish_one` runs the oldest and posts its end to the loop, as ``run_then`` does,
    at a point in the loop's order of callbacks the test chooses."""

    def __init__(self):
        self.pending: list = []

    def run_then(self, loop, fn, args, then):
        self.pending.append((loop, fn, args, then))

    def finish_one(self) -> None:
        loop, fn, args, then = self.pending.pop(0)
        loop.call_soon(then, fn(*args), None)


def _posting_batcher(max_batch_size: int) -> tuple[_PostingWorker, AutoBatcher, list]:
    """An AutoBatcher on a :class:`_PostingWorker` with one slot, grouping items by their
    first character, and the list of the batches it runs."""
    worker, batches = _PostingWorker(), []

    def record(items):
        batches.append(list(items))
        return items

    batcher = AutoBatcher(
        record, worker, max_batch_size=max_batch_size, max_in_flight=1, group=lambda i: i[0]
    )
    return worker, batcher, batches


class TestFiringRule:
    @pytest.mark.parametrize("full_batch_between", [False, True])
    def test_a_gather_still_submitting_is_never_cut(self, full_batch_between):
        """The running batch ends after two of a gather's six tasks have submitted (and,
        in the second case, another client's full batch of another group arrives right
        then, into the freed slot's flush): the older lone request Y goes first, and the
        gather's six requests still form one batch (with Y when nothing else fires)."""
        worker, batcher, batches = _posting_batcher(max_batch_size=8)
        others = [f"h{i}" for i in range(8)]

        async def main():
            x = batcher.submit("gX")
            await asyncio.sleep(0)  # X fires (the only slot)
            y = batcher.submit("gY")
            await asyncio.sleep(0)  # Y's flush ran: no room

            async def client(i):
                return await batcher.submit(f"gZ{i}")

            async def other_client():
                return await asyncio.gather(*batcher.submit_many(others))

            tasks = [asyncio.ensure_future(client(i)) for i in range(2)]
            worker.finish_one()  # X's end lands between the gather's tasks 2 and 3
            if full_batch_between:
                tasks.append(asyncio.ensure_future(other_client()))
            tasks += [asyncio.ensure_future(client(i)) for i in range(2, 6)]
            while worker.pending or not all(t.done() for t in tasks):
                await asyncio.sleep(0)
                if worker.pending:
                    worker.finish_one()
            await asyncio.gather(x, y, *tasks)

        run(main())
        gather = [f"gZ{i}" for i in range(6)]
        if full_batch_between:  # Y, then the gather (older than the full batch)
            assert batches == [["gX"], ["gY"], gather, others]
        else:
            assert batches == [["gX"], ["gY", *gather]]

    def test_a_gathered_step_fires_as_one_batch_with_no_timer(self):
        """With the default options, the 16 requests of one gather reach the backend as
        one batch, and the scheduler never arms a timer."""
        lm = MockLM(VOCAB, cache_bytes=0)
        timers = []

        async def main():
            loop = asyncio.get_running_loop()
            call_at = loop.call_at

            def spy(when, callback, *args, **kwargs):
                if getattr(callback, "__self__", None) is lm.batcher:
                    timers.append(callback)
                return call_at(when, callback, *args, **kwargs)

            loop.call_at = spy
            rows = await asyncio.gather(*(lm.next_token_logprobs([1, i]) for i in range(16)))
            del loop.call_at
            return rows

        rows = run(main())
        assert lm.batches == [[(1, i) for i in range(16)]] and timers == []
        for i, row in enumerate(rows):
            np.testing.assert_allclose(row, mock_logprobs((1, i), 32), atol=1e-6)
        lm.close()

    def test_requests_arriving_while_the_worker_is_full_form_the_next_batch(self, gated):
        """A gather arriving while a batch runs fires at once into the worker's free slot;
        requests trickling in once both slots are taken queue up and run as one batch."""
        gate, batcher = gated(max_batch_size=8)

        async def main():
            first = batcher.submit(0)
            await until(lambda: gate.started == 1)
            ready = [batcher.submit(i) for i in (1, 2, 3)]  # the slot behind the running one
            later = []
            for i in (4, 5, 6):  # each in its own loop iteration, no slot left
                await asyncio.sleep(0)
                later.append(batcher.submit(i))
            await asyncio.sleep(0.01)
            assert not any(w.done() for w in later)
            gate.open()
            return await asyncio.wait_for(asyncio.gather(first, *ready, *later), 5)

        assert run(main()) == [("r", i) for i in range(7)]
        assert gate.batches == [[0], [1, 2, 3], [4, 5, 6]]

    def test_a_trickling_caller_with_max_wait_s_still_batches(self):
        """Requests made one loop iteration apart share a batch when max_wait_s is set,
        and run one by one without it."""
        for max_wait_s, expected in ((1.0, [[0, 1, 2]]), (0.0, [[0], [1], [2]])):
            worker = ModelWorker("test")
            gate = Gate()
            batcher = AutoBatcher(gate, worker, max_wait_s=max_wait_s, max_in_flight=3)

            async def main(batcher):
                waiters = []
                for i in range(3):
                    waiters.append(batcher.submit(i))
                    await asyncio.sleep(0)
                return await asyncio.wait_for(asyncio.gather(*waiters), 5)

            assert run(main(batcher)) == [("r", i) for i in range(3)]
            assert gate.batches == expected, max_wait_s
            worker.close()


class TestOptionsSetLater:
    """The options may be set while requests wait: those requests follow the new values."""

    @pytest.mark.parametrize("new_wait", [0.0, 0.001])
    def test_a_lowered_max_wait_s_applies_to_queued_requests(self, new_wait):
        """Requests queued under a long wait are served under the new, short one (before,
        a wait set to 0 left them queued with no flush or timer to fire them: never
        answered), and so are the requests queued behind them."""
        worker = ModelWorker("test")
        gate = Gate()
        batcher = AutoBatcher(gate, worker, max_wait_s=1000.0, max_batch_size=8)

        async def main():
            first = batcher.submit(0)
            for _ in range(5):
                await asyncio.sleep(0)
            assert not first.done() and gate.started == 0  # waiting for company
            behind = batcher.submit(1)
            await asyncio.sleep(0)
            batcher.max_wait_s = new_wait
            gc.collect()  # nothing but its flush or timer holds the loop's state
            return await asyncio.wait_for(asyncio.gather(first, behind), 30)

        assert run(main()) == [("r", 0), ("r", 1)]
        worker.close()

    def test_max_wait_s_set_from_another_thread_reaches_the_loop(self):
        """A setter called off the loop's thread has the loop apply the rule itself."""
        worker = ModelWorker("test")
        gate = Gate()
        batcher = AutoBatcher(gate, worker, max_wait_s=1000.0)

        async def main():
            waiter = batcher.submit(0)
            await asyncio.sleep(0)  # its arrival flush ran: it waits for company
            setter = threading.Thread(target=setattr, args=(batcher, "max_wait_s", 0.0))
            setter.start()
            setter.join(10)
            return await asyncio.wait_for(waiter, 30)

        assert run(main()) == ("r", 0)
        worker.close()

    def test_a_raised_max_in_flight_hands_a_waiting_batch_over_now(self, gated):
        """A batch queued for want of room goes to the worker as soon as room is made: a
        request made afterwards no longer joins it."""
        gate, batcher = gated(max_in_flight=1)

        async def main():
            first = batcher.submit(0)
            await until(lambda: gate.started == 1)
            second = batcher.submit(1)
            await asyncio.sleep(0.01)  # its arrival flush ran; no room, so it waits
            batcher.max_in_flight = 2
            third = batcher.submit(2)
            await asyncio.sleep(0.01)
            gate.open()
            return await asyncio.wait_for(asyncio.gather(first, second, third), 5)

        assert run(main()) == [("r", 0), ("r", 1), ("r", 2)]
        assert gate.batches == [[0], [1], [2]]


class TestRunSync:
    def test_items_are_deduplicated_grouped_and_chunked(self):
        """run_sync computes each distinct item once, in batches of one group and at most
        max_batch_size, the oldest request first, and answers every item in order."""
        worker = ModelWorker("test")
        gate = Gate()
        seen = []
        batcher = AutoBatcher(
            gate,
            worker,
            max_batch_size=2,
            key=lambda item: item,
            group=lambda item: item[0],
            on_results=lambda items, results: seen.append((items, list(results))),
        )
        items = [("B", 0), ("A", 0), ("B", 1), ("B", 0), ("B", 2), ("A", 1)]
        assert batcher.run_sync(items) == [("r", item) for item in items]
        assert gate.batches == [[("B", 0), ("B", 1)], [("A", 0), ("A", 1)], [("B", 2)]]
        # on_results sees each computed batch once, with its items' results
        assert seen == [(batch, [("r", item) for item in batch]) for batch in gate.batches]
        assert batcher.run_sync([("A", 2)], notify=False) == [("r", ("A", 2))]
        assert len(seen) == 3  # notify=False leaves on_results out
        worker.close()

    def test_the_first_failing_batch_raises_and_stops_the_rest(self):
        """A batch's exception reaches the caller; later batches are not run."""
        worker = ModelWorker("test")
        batches = []

        def run_batch(items):
            batches.append(list(items))
            if 1 in items:
                raise ValueError("bad batch")
            return items

        batcher = AutoBatcher(run_batch, worker, max_batch_size=1)
        with pytest.raises(ValueError, match="bad batch"):
            batcher.run_sync([0, 1, 2])
        assert batches == [[0], [1]]
        batcher.reject_new()
        with pytest.raises(ModelClosedError):
            batcher.run_sync([0])
        worker.close()

    def test_a_failing_on_results_stops_the_later_batches(self):
        """on_results raising for a batch fails run_sync with its error, and the later
        batches are not run (as when the backend itself fails)."""
        worker = ModelWorker("test")
        batches = []

        def on_results(items, results):
            if 2 in items:
                raise RuntimeError("store failed")

        batcher = AutoBatcher(
            lambda items: batches.append(list(items)) or list(items),
            worker,
            max_batch_size=2,
            on_results=on_results,
        )
        with pytest.raises(RuntimeError, match="store failed"):
            batcher.run_sync([0, 1, 2, 3, 4, 5])
        assert batches == [[0, 1], [2, 3]]
        worker.close()


class TestBadItems:
    """A key or group function that fails leaves the queues as they were."""

    def test_an_unhashable_group_fails_its_submit_and_leaves_nothing_behind(self):
        """The failing submit raises TypeError; a later request with the same key is
        computed, not joined to a half-queued entry."""
        worker = ModelWorker("test")
        batcher = AutoBatcher(
            lambda items: [("r", item) for item in items],
            worker,
            key=lambda item: item[0],
            group=lambda item: item[1],
        )

        async def main():
            other = batcher.submit(("other", "g"))  # keeps this loop's state alive
            with pytest.raises(TypeError):
                batcher.submit(("k", ["unhashable"]))
            again = batcher.submit(("k", "g"))
            return await asyncio.wait_for(asyncio.gather(other, again), 5)

        assert run(main()) == [("r", ("other", "g")), ("r", ("k", "g"))]
        worker.close()

    def test_submit_many_failing_midway_flushes_what_it_queued(self):
        """An item whose key raises fails submit_many; the items queued before it are
        withdrawn (their work skipped), and a request joining one of them is answered."""
        worker = ModelWorker("test")
        computed = []

        def key(item):
            if item == "bad":
                raise ValueError("no key")
            return item

        def run_batch(items):
            computed.extend(items)
            return [("r", item) for item in items]

        batcher = AutoBatcher(run_batch, worker, key=key)

        async def main():
            # Kept, as a caller logging it would: its traceback keeps this loop's state.
            with pytest.raises(ValueError, match="no key") as failed:
                batcher.submit_many(["a", "b", "bad", "c"])
            joined = batcher.submit("b")
            row = await asyncio.wait_for(joined, 5)
            assert failed.value.__traceback__ is not None
            return row

        assert run(main()) == ("r", "b")
        assert computed == ["b"]  # "a" had no waiter left: dropped at firing
        worker.close()


class TestBackpressure:
    def test_batches_handed_to_the_worker_are_bounded(self, gated):
        """With the worker busy, at most max_in_flight batches wait for it; the rest stay queued."""
        gate, batcher = gated(max_batch_size=2, max_wait_s=0.0)

        async def main():
            waiters = [batcher.submit(i) for i in range(20)]
            await until(lambda: gate.started == 1)
            await asyncio.sleep(0.01)
            assert batcher.worker._queue.qsize() == batcher.max_in_flight - 1
            for waiter in waiters[2:]:  # a timeout gives up on everything not yet running
                waiter.cancel()
            gate.open()
            assert await asyncio.wait_for(asyncio.gather(*waiters[:2]), 5) == [
                ("r", 0),
                ("r", 1),
            ]

        run(main())
        assert gate.batches == [[0, 1]]
        assert batcher.stats == {"batches": 1, "items": 2}

    def test_cancelled_entries_are_skipped_when_the_worker_picks_the_batch_up(self, gated):
        """Waiters cancelled after their batch was handed over, before it started, cost nothing."""
        gate, batcher = gated(max_batch_size=2, max_wait_s=0.0, key=lambda x: x)

        async def main():
            waiters = [batcher.submit(i) for i in range(4)]
            await until(lambda: gate.started == 1)
            await asyncio.sleep(0.01)
            assert (
                batcher.worker._queue.qsize() == 1
            )  # [2, 3] was handed over while both were wanted
            waiters[2].cancel()
            gate.open()
            return await asyncio.wait_for(asyncio.gather(waiters[0], waiters[1], waiters[3]), 5)

        assert run(main()) == [("r", 0), ("r", 1), ("r", 3)]
        assert gate.batches == [[0, 1], [3]]

    def test_cancelled_waiters_do_not_pile_up_while_the_worker_has_no_room(self, gated):
        """While both in-flight slots are taken, a request retried 1000 times (a caller's
        timeouts: each retry a cancelled waiter) and 1000 distinct requests given up leave
        at most 8 waiters and 256 queued entries, not one per retry (they were freed only
        once a slot freed: never, with a hung backend); what is still wanted is computed."""
        gate, batcher = gated(max_batch_size=1, key=lambda x: x)

        async def main():
            busy = [batcher.submit(i) for i in range(2)]  # each full: handed over at once
            (state,) = batcher._states.values()
            assert state.running == 2
            for _ in range(1000):
                batcher.submit("retried").cancel()
            assert len(state.entries["retried"].waiters) <= 8
            for i in range(1000):
                batcher.submit(("given up", i)).cancel()
            kept = batcher.submit("retried")
            assert len(state.entries) <= 2 + 256  # the two in flight and the queue
            gate.open()
            return await asyncio.wait_for(asyncio.gather(*busy, kept), 5)

        assert run(main()) == [("r", 0), ("r", 1), ("r", "retried")]
        assert gate.batches == [[0], [1], ["retried"]]

    def test_pruning_scans_cost_constant_per_request_however_many_are_live(
        self, gated, monkeypatch
    ):
        """With 510 live entries queued (two less than a power of two), 1000 cancelled
        retries look at about as many queued entries as arrive: a queue is scanned again
        only once it has doubled from what its last scan kept (scanned at each power of
        two, each retry brought it back to 512 and looked at every live entry again)."""
        from genlm.core import _scheduler

        looked = [0]
        live = _scheduler._Entry.live

        def counting(entry) -> bool:
            looked[0] += 1
            return live(entry)

        monkeypatch.setattr(_scheduler._Entry, "live", counting)
        gate, batcher = gated(max_batch_size=1, key=lambda x: x)

        async def main():
            busy = [batcher.submit(i) for i in range(2)]  # both slots: nothing is batched
            wanted = [batcher.submit(("live", i)) for i in range(510)]
            looked[0] = 0
            for i in range(1000):
                batcher.submit(("retry", i)).cancel()
            work = looked[0]
            gate.open()
            await asyncio.wait_for(asyncio.gather(*busy, *wanted), 5)
            return work

        assert run(main()) <= 4 * 1000  # it was about 500 * 512

    def test_a_request_joining_a_dropped_entry_is_computed_afresh(self, gated):
        """A duplicate arriving after the worker dropped its entry gets a computation of its own."""
        gate, batcher = gated(max_batch_size=1, max_wait_s=0.0, key=lambda x: x)

        async def main():
            first = batcher.submit(0)
            await until(lambda: gate.started == 1)
            doomed = batcher.submit(1)
            await asyncio.sleep(0.01)
            (state,) = batcher._states.values()
            entry = state.entries[1]
            doomed.cancel()
            gate.open()
            blocking_until(lambda: entry.dropped)  # the loop cannot deliver meanwhile
            again = batcher.submit(1)
            return await asyncio.wait_for(asyncio.gather(first, again), 5)

        assert run(main()) == [("r", 0), ("r", 1)]
        assert gate.batches == [[0], [1]]


class TestRefuseJoinsRaces:
    """``refuse_joins`` (the end of ``clear_cache`` and ``remove_lora``) runs on the caller's
    thread and reads the loop's dedup map whenever it runs: the loop's own steps must
    leave that map right at every moment. Each test calls it at the one moment a thread
    switch could (a hook on the loop's structures), so the race is forced, not waited for."""

    def test_the_entry_in_flight_is_seen_while_an_older_one_is_forgotten(self, gated):
        """Entry E1 for a key was dropped at pick-up and a newer E2 took the key and was
        handed to the worker. When E1's batch ends, E2 stays in the map throughout, so a
        ``refuse_joins`` at that moment closes it. (E1's removal popped the key and put E2
        back: E2, computing from the state before the change, stayed open, and a request
        made after ``clear_cache`` returned joined it and got a row of the old state.)"""
        gate, batcher = gated(max_batch_size=1, max_in_flight=3, key=lambda x: x)
        armed = [False]

        class Watched(dict):
            """The dedup map, calling refuse_joins at its first use of key 1 once armed."""

            def _hook(self, key):
                if armed[0] and key == 1:
                    armed[0] = False
                    batcher.refuse_joins()

            def pop(self, key, *default):
                out = super().pop(key, *default)
                self._hook(key)
                return out

            def get(self, key, default=None):
                out = super().get(key, default)
                self._hook(key)
                return out

            def __delitem__(self, key):
                super().__delitem__(key)
                self._hook(key)

        async def main():
            first = batcher.submit(0)
            await until(lambda: gate.started == 1)
            (state,) = batcher._states.values()
            state.entries = Watched(state.entries)
            doomed = batcher.submit(1)  # E1, handed over behind the first batch
            await asyncio.sleep(0.01)
            older = state.entries[1]
            doomed.cancel()
            gate.open()
            blocking_until(lambda: older.dropped)  # the loop cannot deliver meanwhile
            again = batcher.submit(1)  # E2: handed over at once, before E1's end arrives
            newer = state.entries[1]
            assert newer is not older and state.running == 3
            armed[0] = True
            await asyncio.wait_for(asyncio.gather(first, again), 5)
            return newer

        newer = run(main())
        assert not armed[0], "refuse_joins never ran: the hook missed E1's removal"
        assert newer.dropped  # closed to requests made after the change

    def test_an_entry_mapped_but_not_yet_queued_stays_joinable(self, gated, monkeypatch):
        """A ``refuse_joins`` between a new entry's dedup mapping and its queueing (not in
        flight: it runs after the change) leaves it open: a duplicate joins it, and the
        backend gets each context once per batch (the duplicate was queued as a second
        entry, and the batch held the same context twice)."""
        from genlm.core import _scheduler

        gate, batcher = gated(max_batch_size=4, key=lambda x: x)
        gate.open()
        armed = [True]

        class HookedQueue(_scheduler._Queue):
            """A group's queue, made between the two steps: refuse_joins runs then."""

            def __init__(self) -> None:
                super().__init__()
                if armed[0]:
                    armed[0] = False
                    batcher.refuse_joins()

        monkeypatch.setattr(_scheduler, "_Queue", HookedQueue)

        async def main():
            return await asyncio.wait_for(asyncio.gather(batcher.submit(7), batcher.submit(7)), 5)

        assert run(main()) == [("r", 7), ("r", 7)]
        assert not armed[0] and gate.batches == [[7]]


class TestBatchCalls:
    """``batch_next_token_logprobs`` awaits the scheduler's futures itself (no task per
    context) and keeps what a gather of single calls guaranteed."""

    def test_rows_come_in_order_from_cache_and_one_batch_without_tasks(self):
        """Cached rows, duplicates and new contexts answer in order; the new distinct ones
        form one batch, and the call creates no task."""
        lm = MockLM(VOCAB)
        contexts = [[1, 2], [3], [1, 2], [4, 4], [3], [5]]
        tasks = []

        async def main():
            await lm.next_token_logprobs([3])  # cached before the batch call
            loop = asyncio.get_running_loop()
            create_task = loop.create_task

            def spy(coro, **kwargs):
                tasks.append(coro)
                return create_task(coro, **kwargs)

            loop.create_task = spy
            try:
                return await lm.batch_next_token_logprobs(contexts)
            finally:
                del loop.create_task

        rows = run(main())
        assert tasks == []
        assert lm.batches == [[(3,)], [(1, 2), (4, 4), (5,)]]
        assert rows.shape == (6, 32)
        for row, context in zip(rows, contexts):
            np.testing.assert_allclose(row, mock_logprobs(tuple(context), 32), atol=1e-6)
        lm.close()

    def test_cancelling_a_batch_call_withdraws_its_queued_rows(self):
        """A cancelled batch call leaves nothing to compute: its queued contexts are dropped
        and a request made alongside it still runs."""
        lm = MockLM(VOCAB, cache_bytes=0, max_wait_s=0.05)

        async def main():
            doomed = asyncio.ensure_future(lm.batch_next_token_logprobs([[7], [8, 8], [9]]))
            kept = asyncio.ensure_future(lm.next_token_logprobs([6]))
            await asyncio.sleep(0)
            doomed.cancel()
            with pytest.raises(asyncio.CancelledError):
                await doomed
            return await kept

        row = run(main())
        np.testing.assert_allclose(row, mock_logprobs((6,), 32), atol=1e-6)
        assert lm.batches == [[(6,)]]
        lm.close()

    def test_a_failed_batch_fails_the_call_and_the_model_recovers(self):
        """The backend's error reaches the batch call; the same contexts then compute."""
        lm = MockLM(VOCAB, cache_bytes=0, max_batch_size=2)
        original = lm._logprobs_batch

        def flaky(contexts, variant):
            if len(lm.batches) == 0 and (0,) in contexts:
                lm.batches.append([])  # counts the failed call
                raise RuntimeError("device fell over")
            return original(contexts, variant)

        lm._logprobs_batch = flaky
        contexts = [[i] for i in range(5)]
        with pytest.raises(RuntimeError, match="fell over"):
            run(lm.batch_next_token_logprobs(contexts))
        rows = run(lm.batch_next_token_logprobs(contexts))
        for row, context in zip(rows, contexts):
            np.testing.assert_allclose(row, mock_logprobs(tuple(context), 32), atol=1e-6)
        lm.close()

    def test_submit_many_hands_full_batches_over_once_every_item_is_queued(self, gated):
        """Full batches of one submit_many call reach the worker after its last item is
        queued (the worker wakes once for them), as many as max_in_flight allows."""
        keyed: list = []
        gate, batcher = gated(max_batch_size=2, key=lambda item: keyed.append(item) or item)
        fired_after: list[int] = []
        run_then = batcher.worker.run_then

        def recording(*args):
            fired_after.append(len(keyed))
            return run_then(*args)

        batcher.worker.run_then = recording

        async def main():
            futures = batcher.submit_many(list(range(7)))
            assert fired_after == [7, 7]  # both in-flight slots, once all 7 were keyed
            gate.open()
            return await asyncio.wait_for(asyncio.gather(*futures), 5)

        assert run(main()) == [("r", i) for i in range(7)]
        assert gate.batches == [[0, 1], [2, 3], [4, 5], [6]]

    def test_a_failing_on_results_fails_its_batch_only(self, gated):
        """on_results runs once per computed batch, before its waiters resume; when it
        raises, that batch's waiters get the error and the other batches their results."""
        seen: list = []

        def on_results(items, results):
            seen.append((list(items), list(results)))
            if 0 in items:
                raise OSError("cache full")

        gate, batcher = gated(max_batch_size=2, key=lambda item: item, on_results=on_results)
        gate.open()

        async def main():
            futures = batcher.submit_many([0, 1, 2, 3])
            return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 5)

        outcomes = run(main())
        assert [type(o) for o in outcomes[:2]] == [OSError, OSError]
        assert outcomes[2:] == [("r", 2), ("r", 3)]
        assert seen == [([0, 1], [("r", 0), ("r", 1)]), ([2, 3], [("r", 2), ("r", 3)])]

        async def again():  # the failed entries were forgotten: 1 is computed afresh
            return await asyncio.wait_for(batcher.submit(1), 5)

        assert run(again()) == ("r", 1) and seen[-1] == ([1], [("r", 1)])

    def test_submit_many_batches_like_gathered_submits(self, gated):
        """Items submitted together are deduplicated and cut into full batches in order;
        each item gets its own future."""
        gate, batcher = gated(max_batch_size=2, key=lambda item: item)
        gate.open()

        async def main():
            futures = batcher.submit_many([0, 1, 0, 2, 3, 4])
            assert len({id(f) for f in futures}) == 6
            return await asyncio.wait_for(asyncio.gather(*futures), 5)

        assert run(main()) == [("r", i) for i in (0, 1, 0, 2, 3, 4)]
        assert gate.batches == [[0, 1], [2, 3], [4]]
