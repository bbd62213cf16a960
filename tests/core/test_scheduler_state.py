"""A Hypothesis state machine driving the scheduler from two event loops in two threads.

Rules submit (from loop A, driven step by step on this thread, or loop B, running in its
own thread), cancel, hold and release the worker, make batches fail, interleave a sync
worker call (what ``clear_cache`` does) and close. Whatever the interleaving:

* every waiter not cancelled gets its own item's result, or the exception of a batch
  that held its item, or ``ModelClosedError`` once closed; none hangs;
* a batch holds one group, at most ``max_batch_size`` distinct items;
* after close, nothing is queued and no timer is armed on either loop.
"""

import asyncio
import threading

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from genlm.core import ModelClosedError
from genlm.core.backend import AutoBatcher, ModelWorker

MAX_BATCH = 3
BAD = 4  # an item (group, BAD) makes its whole batch fail


class Boom(RuntimeError):
    """The backend's failure; carries the batch it failed."""

    def __init__(self, items):
        super().__init__(f"batch {items} failed")
        self.items = items


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.problems: list[str] = []
        self.worker = ModelWorker("test-state")
        self.batcher = AutoBatcher(
            self.run_batch,
            self.worker,
            max_batch_size=MAX_BATCH,
            max_wait_s=0.001,
            key=lambda item: item,
            group=lambda item: item[0],
        )
        self.loop_a = asyncio.new_event_loop()
        self.loop_b = asyncio.new_event_loop()
        self.loop_b.set_debug(True)  # asyncio then refuses calls from the wrong thread
        self.thread_b = threading.Thread(target=self.loop_b.run_forever)
        self.thread_b.start()
        #: (loop, item, the task awaiting its result) for every accepted submission.
        self.waiters: list[tuple[asyncio.AbstractEventLoop, tuple, asyncio.Task]] = []
        self.cancel_requested: set[int] = set()
        self.closed = False

    def run_batch(self, items):
        if len({item[0] for item in items}) != 1 or not 1 <= len(items) <= MAX_BATCH:
            self.problems.append(f"bad batch {items}")
        if len(set(items)) != len(items):
            self.problems.append(f"duplicates in {items}")
        if not self.gate.wait(10):
            self.problems.append("the worker was held for good")
        if any(item[1] == BAD for item in items):
            raise Boom(list(items))
        return [("r", item) for item in items]

    def _submit_on(self, loop, item):
        """A task awaiting the item's result on ``loop``, as a caller would hold it."""

        async def submit():
            waiter = self.batcher.submit(item)  # a closed batcher refuses at once

            async def wait():
                return await waiter

            return asyncio.ensure_future(wait())

        if loop is self.loop_a:
            return loop.run_until_complete(submit())
        return asyncio.run_coroutine_threadsafe(submit(), loop).result(5)

    @rule(on_b=st.booleans(), group=st.sampled_from("xy"), n=st.integers(0, BAD))
    def submit(self, on_b, group, n):
        loop = self.loop_b if on_b else self.loop_a
        try:
            waiter = self._submit_on(loop, (group, n))
        except ModelClosedError:
            assert self.closed
            return
        assert not self.closed
        self.waiters.append((loop, (group, n), waiter))

    @precondition(lambda self: self.waiters)
    @rule(data=st.data())
    def cancel(self, data):
        index = data.draw(st.integers(0, len(self.waiters) - 1))
        loop, _, waiter = self.waiters[index]
        self.cancel_requested.add(index)
        if loop is self.loop_a:
            waiter.cancel()
        else:
            loop.call_soon_threadsafe(waiter.cancel)

    @rule()
    def step_loop_a(self):
        self.loop_a.run_until_complete(asyncio.sleep(0.002))

    @rule()
    def hold_worker(self):
        self.gate.clear()

    @rule()
    def release_worker(self):
        self.gate.set()

    @rule()
    def sync_worker_call(self):
        self.gate.set()  # a blocking call behind a held batch would wait for the gate
        assert self.worker.call(lambda: "done") == "done"

    @rule()
    def close(self):
        self.gate.set()
        self.loop_a.run_until_complete(asyncio.wait_for(self.batcher.aclose(), 5))
        self.closed = True
        self._check_nothing_queued(self.loop_a)

    @invariant()
    def batches_are_well_formed(self):
        assert not self.problems, self.problems

    def _check_nothing_queued(self, loop):
        state = self.batcher._states.get(id(loop))
        if state is not None:  # a state emptied may already be gone
            assert not state.queues and state.timer is None

    def _check_outcome(self, index, item, waiter):
        if waiter.cancelled():
            assert index in self.cancel_requested
            return
        exc = waiter.exception()
        if exc is None:
            assert waiter.result() == ("r", item)
        elif isinstance(exc, Boom):
            assert item in exc.items and any(i[1] == BAD for i in exc.items)
        else:
            assert isinstance(exc, ModelClosedError) and self.closed, repr(exc)

    def teardown(self):
        try:
            self.gate.set()
            on_a = [w for loop, _, w in self.waiters if loop is self.loop_a]
            on_b = [w for loop, _, w in self.waiters if loop is self.loop_b]
            if on_a:
                self.loop_a.run_until_complete(asyncio.wait(on_a, timeout=5))
            if on_b:

                async def wait_b():
                    await asyncio.wait(on_b, timeout=5)

                asyncio.run_coroutine_threadsafe(wait_b(), self.loop_b).result(10)
            assert all(w.done() for _, _, w in self.waiters), "a waiter never resolved"
            for index, (_, item, waiter) in enumerate(self.waiters):
                self._check_outcome(index, item, waiter)
            self.loop_a.run_until_complete(asyncio.wait_for(self.batcher.aclose(), 5))

            async def nothing():
                pass

            asyncio.run_coroutine_threadsafe(nothing(), self.loop_b).result(5)  # B ran its close
            self._check_nothing_queued(self.loop_a)
            self._check_nothing_queued(self.loop_b)
        finally:
            self.gate.set()
            self.loop_b.call_soon_threadsafe(self.loop_b.stop)
            self.thread_b.join(5)
            self.loop_b.close()
            self.loop_a.close()
            self.worker.close()


TestSchedulerState = SchedulerMachine.TestCase
TestSchedulerState.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
