"""ModelWorker: the thread survives every call, cancellation and close (issue 12, items 5, 6, 9)."""

import asyncio
import concurrent.futures
import gc
import logging
import signal
import threading
import time
import weakref

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.child import run_program
from support.faulty import within

from genlm.core import BackendError, ModelClosedError
from genlm.core.backend import ModelWorker, Requeue

#: What a backend may raise that a future cannot carry, or that is no exception.
UNTRANSPORTABLE = [
    StopIteration,
    StopAsyncIteration,
    KeyboardInterrupt,
    SystemExit,
    GeneratorExit,
    asyncio.CancelledError,
]


def raiser(exc):
    def fn():
        raise exc("from the backend")

    return fn


def assert_serving(worker):
    """The worker still runs calls, on its thread, which is alive."""
    assert within(5, worker.call, threading.current_thread) is worker._thread
    assert worker._thread.is_alive()


class TestSurvival:
    def test_cancelled_submit_future_is_skipped_and_the_worker_keeps_serving(self):
        """A submit future cancelled while queued neither kills the thread nor runs."""
        worker = ModelWorker("test")
        gate = threading.Event()
        ran = []
        first = worker.submit(gate.wait, 5)
        second = worker.submit(ran.append, "second")
        assert second.cancel()
        gate.set()
        assert first.result(timeout=5) is True
        assert_serving(worker)
        assert ran == []
        worker.close()

    @pytest.mark.parametrize("exc", UNTRANSPORTABLE, ids=lambda e: e.__name__)
    def test_untransportable_exception_reaches_call_as_backend_error(self, exc, caplog):
        """call(): BackendError chained from the original, logged, and the worker serves on."""
        worker = ModelWorker("test")
        with caplog.at_level(logging.ERROR, logger="genlm.core._worker"):
            with pytest.raises(BackendError, match=exc.__name__) as info:
                within(5, worker.call, raiser(exc))
        assert type(info.value.__cause__) is exc
        assert exc.__name__ in caplog.text
        assert_serving(worker)
        worker.close()

    @pytest.mark.parametrize("exc", UNTRANSPORTABLE, ids=lambda e: e.__name__)
    def test_untransportable_exception_reaches_run_async_as_backend_error(self, exc):
        """run_async(): the awaiting coroutine gets BackendError instead of hanging."""
        worker = ModelWorker("test")

        async def main():
            with pytest.raises(BackendError) as info:
                await asyncio.wait_for(worker.run_async(raiser(exc)), 5)
            assert type(info.value.__cause__) is exc
            return await asyncio.wait_for(worker.run_async(lambda: 7), 5)

        assert asyncio.run(main()) == 7
        assert_serving(worker)
        worker.close()

    def test_ordinary_exception_reaches_the_caller_unchanged(self):
        """An Exception from a call is raised as itself (users catch their engine's errors)."""
        worker = ModelWorker("test")
        boom = ValueError("boom")

        def fn():
            raise boom

        with pytest.raises(ValueError) as info:
            within(5, worker.call, fn)
        assert info.value is boom
        worker.close()

    def test_result_for_a_closed_event_loop_is_dropped_quietly(self):
        """A run_async whose loop closed before the result is posted does not hurt the worker."""
        worker = ModelWorker("test")
        gate = threading.Event()

        async def main():
            worker.run_async(gate.wait, 5)  # nobody awaits; the loop ends first

        asyncio.run(main())
        gate.set()
        assert_serving(worker)
        worker.close()


class TestClose:
    def test_close_racing_a_call_never_leaves_it_blocked(self):
        """close() between the worker's start and the queueing of a call: the call
        either runs or raises ModelClosedError, it never waits on a stopped thread."""
        worker = ModelWorker("test")
        inner = worker._queue

        class CloseBeforePut:
            """Runs close() on another thread just before the first call is queued."""

            triggered = False
            closer: threading.Thread | None = None

            def put(self, item):
                if isinstance(item, tuple) and not self.triggered:
                    self.triggered = True
                    closer = threading.Thread(target=worker.close, kwargs={"wait": False})
                    closer.start()
                    closer.join(0.5)  # the fixed worker holds its lock: close waits for us
                    CloseBeforePut.closer = closer
                inner.put(item)

            def get(self):
                return inner.get()

        worker._queue = CloseBeforePut()
        try:
            assert within(5, worker.call, lambda: 7) == 7
        except ModelClosedError:
            pass
        CloseBeforePut.closer.join(5)  # close() may still be waiting for the lock under load
        assert worker.closed
        worker.stopped.result(timeout=5)
        with pytest.raises(ModelClosedError):
            worker.call(lambda: 7)

    def test_second_close_waits_until_the_thread_stopped(self):
        """close() after close(wait=False) returns only once the queued calls ran."""
        worker = ModelWorker("test")
        gate = threading.Event()
        running = worker.submit(gate.wait, 5)
        later = worker.submit(lambda: "later")
        worker.close(wait=False)
        second = threading.Thread(target=worker.close)
        second.start()
        second.join(0.1)
        assert second.is_alive()  # it is waiting for the blocked call
        gate.set()
        second.join(5)
        assert not second.is_alive()
        assert running.result(timeout=0) is True and later.result(timeout=0) == "later"
        assert worker.stopped.done() and not worker._thread.is_alive()

    def test_close_of_a_never_started_worker(self):
        """A worker closed before any call starts no thread and reports it stopped."""
        worker = ModelWorker("test")
        worker.close()
        worker.close()
        assert worker._thread is None and worker.stopped.done()
        with pytest.raises(ModelClosedError):
            worker.submit(lambda: 1)

    @pytest.mark.parametrize("park", [False, True])
    def test_a_thread_that_failed_to_start_is_tried_again(self, monkeypatch, park):
        """A call whose thread could not be started fails alone: the next call starts one
        and runs, and close finishes (the unstarted thread was kept: every later call waited
        on it, and close raised or, parking, never returned)."""
        start = threading.Thread.start

        def fail_once(thread):
            monkeypatch.setattr(threading.Thread, "start", start)
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(threading.Thread, "start", fail_once)
        worker = ModelWorker("test", park=park)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            worker.call(lambda: 1)
        assert worker.submit(lambda: 2).result(timeout=5) == 2
        assert_serving(worker)
        within(5, lambda: worker.close(wait=True))
        assert worker.stopped.done()

    def test_wait_stopped_can_be_cancelled_and_awaited_again(self):
        """Cancelling wait_stopped() cancels only the wait; a second wait completes."""
        worker = ModelWorker("test")
        gate = threading.Event()
        worker.submit(gate.wait, 5)
        worker.close(wait=False)

        async def main():
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(worker.wait_stopped(), 0.05)
            gate.set()
            await asyncio.wait_for(worker.wait_stopped(), 5)
            assert worker.stopped.done()

        asyncio.run(main())
        worker._thread.join(5)
        assert not worker._thread.is_alive()

    def test_a_parked_worker_stops_serving_but_its_thread_stays(self):
        """park=True (the mlx backend's, whose engine aborts the process when a thread that
        ran it ends): close returns once the queued calls ran, later calls are refused, and
        the thread waits on, holding no reference to its worker."""
        worker = ModelWorker("test-park", park=True)
        assert worker.call(lambda: threading.current_thread().name) == "test-park"
        thread = worker._thread
        worker.close(wait=True)
        assert worker.stopped.done() and thread.is_alive() and thread.daemon
        with pytest.raises(ModelClosedError):
            worker.submit(lambda: 1)
        ref = weakref.ref(worker)
        del worker
        gc.collect()
        assert ref() is None and thread.is_alive()

    def test_waiting_for_the_stop_does_not_keep_the_loop_alive(self):
        """Each loop that awaited wait_stopped() (every aclose does) is freed with its
        asyncio.run while the worker lives on: the done-callback the worker's future keeps
        for good held the loop and its future."""
        worker = ModelWorker("test")
        gate = threading.Event()
        worker.submit(gate.wait, 5)
        worker.close(wait=False)
        loops = []

        async def wait_then_stop():
            loops.append(weakref.ref(asyncio.get_running_loop()))
            if len(loops) == 2:  # the first wait was cut short; this one sees the stop
                gate.set()
                await asyncio.wait_for(worker.wait_stopped(), 5)
            else:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(worker.wait_stopped(), 0.01)

        asyncio.run(wait_then_stop())
        asyncio.run(wait_then_stop())

        async def after_the_stop():  # a wait that starts once the worker has stopped
            loops.append(weakref.ref(asyncio.get_running_loop()))
            await worker.wait_stopped()

        asyncio.run(after_the_stop())
        gc.collect()
        assert [ref() for ref in loops] == [None, None, None]


#: A worker, started, whose next call runs across the program's end: it waits until the
#: program has ended (``exiting``, set by an exit handler registered after the thread's
#: start, so run before the worker's own exit stop), then sleeps past the moment the
#: interpreter finalizes, which only a finished call can print after. A second call waits
#: behind it, and an idle worker is never closed.
WORKER_AT_EXIT = """
import atexit, signal, threading, time
from genlm.core.backend import ModelWorker
signal.signal(signal.SIGINT, signal.default_int_handler)
worker = ModelWorker('busy', park={park})
worker.call(int)
ModelWorker('idle', park={park}).call(int)
exiting, running = threading.Event(), threading.Event()
atexit.register(exiting.set)

def run_across_the_end():
    print('running', flush=True)
    running.set()
    exiting.wait(60)
    time.sleep(0.2)
    print('running call finished', flush=True)

call = worker.submit(run_across_the_end)
queued = worker.submit(lambda: print('queued call ran', flush=True))
queued.add_done_callback(lambda f: print('queued call:', type(f.exception()).__name__, flush=True))
running.wait(60)
"""

#: How the program ends while the call runs, and the exit status that must show it.
ENDINGS = {
    "SystemExit": ("raise SystemExit(3)\n", 3),
    "closed": ("worker.close(wait=False)\n", 0),  # closed without waiting, then ends
    "ctrl-c": ("call.result()\n", -signal.SIGINT),  # blocked on the call: SIGINT
}


class TestExit:
    """A program that ends while a worker runs a call exits with its own status: the exit
    lets the running call finish before the interpreter finalizes (a daemon thread cut off
    inside torch then aborts the process, status 134; a parking one must block first) and
    fails the queued calls without running them. Each program runs in a fresh interpreter,
    with a timeout."""

    @pytest.mark.parametrize("park", [False, True], ids=["thread", "parking"])
    @pytest.mark.parametrize("ending", sorted(ENDINGS))
    def test_the_running_call_finishes_and_the_queued_ones_fail(self, park, ending):
        """The running call prints once the program has ended, the queued call fails with
        ModelClosedError without running, and the exit status is the program's."""
        code, status = ENDINGS[ending]
        program = WORKER_AT_EXIT.format(park=park) + code
        ended = run_program(program, interrupt_after="running" if ending == "ctrl-c" else None)
        assert ended.lines == ["running", "running call finished", "queued call: ModelClosedError"]
        assert ended.returncode == status, ended.stderr

    def test_an_error_ending_asyncio_run_lets_the_running_batch_finish(self):
        """A model's batch runs when an exception escapes asyncio.run: the batch finishes,
        the one queued behind it on the worker does not run, and the status is 1."""
        program = """
import asyncio, atexit, threading
from genlm.core.mock import MockLM
exiting, started = threading.Event(), threading.Event()

class AtExit(MockLM):
    def _logprobs_batch(self, contexts, variant):
        print('batch of', len(contexts), flush=True)
        atexit.register(exiting.set)  # after the worker's start: runs before its exit stop
        started.set()
        exiting.wait(60)
        rows = super()._logprobs_batch(contexts, variant)  # sleeps past the finalization
        print('batch done', flush=True)
        return rows

lm = AtExit([bytes([i]) for i in range(256)], latency_s=0.2, max_batch_size=2)

async def main():
    batches = asyncio.ensure_future(lm.batch_next_token_logprobs([[1], [2], [3], [4]]))
    await asyncio.to_thread(started.wait, 60)
    raise ValueError('a bug in the program')

asyncio.run(main())
"""
        ended = run_program(program)
        assert ended.lines == ["batch of 2", "batch done"]
        assert ended.returncode == 1, ended.stderr
        assert "ValueError: a bug in the program" in ended.stderr

    @pytest.mark.parametrize("park", [False, True], ids=["thread", "parking"])
    def test_the_exit_does_not_wait_for_ever(self, park):
        """A call that never ends holds the exit only up to the limit (shortened here), then
        the program exits with its status and a warning naming the worker."""
        program = (
            "import threading\n"
            "import genlm.core._worker as worker_module\n"
            "from genlm.core.backend import ModelWorker\n"
            "worker_module._EXIT_WAIT_S = 0.5\n"
            f"worker = ModelWorker('stuck', park={park})\n"
            "started = threading.Event()\n"
            "worker.submit(lambda: (started.set(), threading.Event().wait()))\n"
            "started.wait(60)\n"
            "raise SystemExit(3)\n"
        )
        ended = run_program(program, timeout_s=60)
        assert ended.returncode == 3, ended.stderr
        assert "exit goes on while stuck still run(s) a call" in ended.stderr


# ---- random interleavings ---------------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 100)),
        st.tuples(st.just("cancel"), st.integers(0, 20)),
        st.tuples(st.just("release"), st.just(0)),
        st.tuples(st.just("close"), st.booleans()),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_random_submit_cancel_close_interleavings(ops):
    """Any sequence of submit/cancel/release/close ends with every future settled: a
    cancelled one never ran, the others ran once each in submission order with the right
    result, submissions after close raised ModelClosedError, and the thread stopped."""
    worker = ModelWorker("test")
    gate = threading.Event()
    blocker = worker.submit(gate.wait, 5)  # holds the worker so cancels hit queued calls
    ran = []
    submitted: list[tuple[int, concurrent.futures.Future]] = []
    closed = False

    def work(x):
        ran.append(x)
        return 2 * x

    for op, arg in ops:
        if op == "submit":
            if closed:
                with pytest.raises(ModelClosedError):
                    worker.submit(work, arg)
            else:
                submitted.append((arg, worker.submit(work, arg)))
        elif op == "cancel" and submitted:
            submitted[arg % len(submitted)][1].cancel()
        elif op == "release":
            gate.set()
        elif op == "close":
            closed = True
            if gate.is_set() and arg:
                within(5, worker.close)
            else:
                worker.close(wait=False)
    gate.set()
    within(5, worker.close)
    assert blocker.result(timeout=0) is True
    expected = []
    for x, future in submitted:
        assert future.done()
        if future.cancelled():
            continue
        assert future.result(timeout=0) == 2 * x
        expected.append(x)
    assert ran == expected
    assert not worker._thread.is_alive()


def wait_collected(ref, timeout_s=5.0):
    """Whether ``ref``'s object is collected within ``timeout_s`` (the worker drops its
    references just after delivering, on its own thread, so the test polls)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        gc.collect()
        if ref() is None:
            return True
        time.sleep(0.001)
    return False


class Payload:
    """A weakly referenceable stand-in for a batch's arguments and result arrays."""


def test_an_idle_worker_holds_no_reference_to_its_last_call():
    """After a call the worker, waiting for the next one, keeps neither its arguments and
    result (submit) nor its event loop, asyncio future and result (run_async). It used to
    keep its last queue item in a local variable: one batch per model, until the next call."""
    worker = ModelWorker("test")
    argument = Payload()
    future = worker.submit(lambda payload: Payload(), argument)
    result_ref = weakref.ref(future.result(timeout=5))
    argument_ref = weakref.ref(argument)
    del argument, future
    assert wait_collected(argument_ref) and wait_collected(result_ref)

    refs = {}

    async def one_call():
        loop = asyncio.get_running_loop()
        pending = worker.run_async(Payload)
        refs["loop"], refs["future"] = weakref.ref(loop), weakref.ref(pending)
        refs["result"] = weakref.ref(await pending)

    asyncio.run(one_call())
    assert {name: wait_collected(ref) for name, ref in refs.items()} == dict.fromkeys(refs, True)
    assert_serving(worker)
    worker.close()


class TestRequeue:
    """A call returning ``Requeue`` lets the calls queued meanwhile through, then finishes;
    its caller gets the last part's outcome."""

    @staticmethod
    def parts(log, gate, name, n):
        """A call of ``n`` parts, each logged; the first waits for ``gate`` so that the test
        can queue other calls behind it."""

        def part(i):
            if i == 0:
                gate.wait(5)
            log.append(f"{name}{i}")
            return Requeue(part, (i + 1,)) if i + 1 < n else f"{name} done"

        return part

    def test_the_rest_runs_behind_the_calls_queued_meanwhile(self):
        worker = ModelWorker("test")
        log, gate = [], threading.Event()
        long = worker.submit(self.parts(log, gate, "a", 3), 0)
        other = worker.submit(log.append, "b")
        gate.set()
        assert long.result(timeout=5) == "a done"
        assert other.result(timeout=5) is None
        # a0 made way for b; with nothing queued behind a1, a2 runs right after it.
        assert log == ["a0", "b", "a1", "a2"]
        worker.close()

    def test_a_failing_part_reaches_the_caller(self):
        worker = ModelWorker("test")

        def fail():
            raise ValueError("second part")

        with pytest.raises(ValueError, match="second part"):
            worker.submit(lambda: Requeue(fail)).result(timeout=5)
        assert_serving(worker)
        worker.close()

    def test_a_part_requeued_after_close_is_refused_and_not_run(self):
        """close() while the first part runs: its caller gets ModelClosedError, the rest
        never runs, and the calls queued before the close still run."""
        worker = ModelWorker("test")
        log, gate = [], threading.Event()
        long = worker.submit(self.parts(log, gate, "a", 2), 0)
        queued = worker.submit(log.append, "b")
        worker.close(wait=False)
        gate.set()
        with pytest.raises(ModelClosedError):
            long.result(timeout=5)
        assert queued.result(timeout=5) is None
        within(5, worker.close)
        assert log == ["a0", "b"]

    def test_on_the_worker_thread_call_finishes_it_inline(self):
        worker = ModelWorker("test")
        log = []
        done = threading.Event()
        done.set()
        nested = worker.call(lambda: worker.call(self.parts(log, done, "a", 3), 0))
        assert (nested, log) == ("a done", ["a0", "a1", "a2"])
        worker.close()

    def test_waiting_calls_are_seen(self):
        """The first of two queued calls sees the second behind it; the second, nothing."""
        worker = ModelWorker("test")
        gate = threading.Event()

        def look():
            gate.wait(5)
            return worker.has_waiting_calls()

        first, second = worker.submit(look), worker.submit(look)
        gate.set()
        assert (first.result(timeout=5), second.result(timeout=5)) == (True, False)
        worker.close()
