"""One dedicated thread per model, so that blocking forward passes leave the event loop free.

Thread-affine engines (MLX streams, vLLM's engine, CUDA contexts) must always see the
same thread, so every call into a backend — loading, forward passes, KV management,
adapter changes — goes through the model's single :class:`ModelWorker`.

Following anyio's worker design, the worker never touches an asyncio future: it runs
the function and posts the outcome back with ``loop.call_soon_threadsafe``; the future
is resolved on the loop thread, and only if it is still pending and the loop is open.

Guarantees (tests/core/test_worker.py):

* **The thread never dies of a call.** Whatever a call raises, and whatever happens while
  its outcome is delivered (a future cancelled meanwhile, a closed loop), the worker logs
  what it must and takes the next call.
* **Every outcome can travel.** ``StopIteration`` and ``StopAsyncIteration`` cannot be
  set on a future, and exceptions that are not :class:`Exception` (``KeyboardInterrupt``,
  ``SystemExit``, ``GeneratorExit``, ``asyncio.CancelledError``) raised on a worker
  thread are no real interrupt (signals reach the main thread only) but would look like
  one to the caller: all of these reach the caller as :class:`BackendError` chained
  from the original (``__cause__``), logged at ERROR, and the worker keeps serving.
* **A call is queued or refused, atomically with** :meth:`ModelWorker.close`: a call
  accepted before ``close`` runs before the thread stops; one after it raises
  :class:`ModelClosedError`. No call is left waiting on a stopped thread.
* **A cancelled** :meth:`ModelWorker.submit` **future is skipped** if it had not started.
* **A long call can make way.** A call that returns :class:`Requeue` has the rest of its
  work queued behind the calls waiting now (:meth:`ModelWorker.has_waiting_calls`); its
  caller gets the outcome of the last part. So an engine run of many steps (vLLM's
  generation) lets a row batch through between two steps instead of holding the thread
  to its end. A part requeued once the worker is closed is not run: its caller gets
  :class:`ModelClosedError`.
* **A program's exit waits for the running calls, not the queued ones.** At exit, before
  the interpreter finalizes (:func:`_stop_at_exit`), every worker is closed: the call it
  runs finishes (a daemon thread cut off inside torch would abort the process instead of
  letting it exit with its own status), the calls queued behind fail with
  :class:`ModelClosedError` without running, and the exit waits for the threads to end
  (or park), at most a minute in all.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from genlm.core._errors import BackendError, ModelClosedError

logger = logging.getLogger(__name__)

T = TypeVar("T")

_STOP = object()

#: Deliver the outcome of one call: ``(result, None)`` or ``(None, exception)``.
Deliver = Callable[[Any, "BaseException | None"], None]


@attrs.frozen
class Requeue:
    """What a worker call returns to finish later: ``fn(*args)`` is queued behind the calls
    waiting now and runs in the same context, and the caller gets its outcome (which may
    be another ``Requeue``). The call must have made progress first (e.g. one engine
    step), so that two calls requeuing in turn still both advance."""

    fn: Callable[..., Any]
    args: tuple = ()


def _always() -> bool:
    return True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _resolver(future: concurrent.futures.Future[Any]) -> Deliver:
    """A delivery that resolves a thread-safe ``future`` with the call's outcome."""

    def deliver(result: Any, exc: BaseException | None) -> None:
        if exc is None:
            future.set_result(result)
        else:
            future.set_exception(exc)

    return deliver


#: Held from import on and never released: a parked thread blocks on it in one C call
#: (see ``ModelWorker(park=True)``), with the GIL released, and never needs it again.
_PARK = threading.Lock()
_PARK.acquire()

#: Idents of the threads told to stop (``close``) that will park but have not blocked
#: yet: until then they run Python (the queued calls, their ``stopped`` callbacks, which
#: release the GIL), and a thread that takes the GIL while the interpreter finalizes is
#: ended, which is what parking avoids (:func:`_stop_at_exit` holds the exit until
#: they have blocked).
_PARKING: set[int] = set()


def _thread_main(box: list[Callable[[], None]], park: bool) -> None:
    """A worker thread's body: serve until stopped (``box`` holds the worker's loop, taken
    out so that the thread's own arguments keep nothing of a stopped worker alive), then
    end, or park for good."""
    run = box.pop()
    try:
        run()  # close() added this thread to _PARKING when it queued the stop
    finally:
        del run
        if park:
            _PARKING.discard(threading.get_ident())
            _PARK.acquire()  # the last Python this thread runs


#: Every worker whose thread started (weakly; a running thread holds its worker): at exit,
#: :func:`_stop_at_exit` stops those still open and waits for their running calls.
_STARTED: weakref.WeakSet[ModelWorker] = weakref.WeakSet()

#: The longest the exit waits, in all, for the calls running on worker threads (a large
#: batch on a loaded CPU takes tens of seconds); past it the exit goes on regardless.
_EXIT_WAIT_S = 60.0

#: How long the exit waits quietly before it logs which workers it is waiting for.
_EXIT_NOTICE_S = 1.0


def _stop_at_exit() -> None:
    """At exit, before the interpreter finalizes: stop every worker whose thread started,
    let each running call finish and fail the queued ones with :class:`ModelClosedError`
    (they are not run; nobody waits for them any more, or their waiters hear of it), and
    wait, up to :data:`_EXIT_WAIT_S` in all, until every thread has ended or parked.

    Why: a daemon thread still running when the interpreter finalizes is cut off when it
    next takes the GIL, and one inside an engine's C++ code then (a torch forward pass)
    aborts the whole process ("terminate called without an active exception", status
    134) instead of exiting with the program's own status; a parking thread (mlx) must
    have blocked before then too. Past the limit, or at a second Ctrl-C during the wait,
    the exit goes on with a warning naming the workers it waited for (whose threads may
    then abort the process, as before): an exit never hangs on a call that does not end."""
    workers = list(_STARTED)
    for worker in workers:
        worker._close_for_exit()
    parking = bool(_PARKING)  # threads on their way to park
    deadline = time.monotonic() + _EXIT_WAIT_S
    busy = workers
    try:
        busy = _wait_for_threads(busy, min(deadline, time.monotonic() + _EXIT_NOTICE_S))
        if busy:
            logger.warning(
                "exit waits for the calls running on %s to finish (at most %.0f s more; "
                "Ctrl-C stops waiting)",
                _names(busy),
                deadline - time.monotonic(),
            )
            busy = _wait_for_threads(busy, deadline)
    except KeyboardInterrupt:  # a second Ctrl-C: the threads' state is unknown from here
        # on (an interrupted join marks its thread stopped, bpo-45274), so no check
        logger.warning("exit stopped waiting for %s: the process may abort", _names(busy))
        return
    if busy:
        logger.warning(
            "exit goes on while %s still run(s) a call: the process may abort", _names(busy)
        )
    if parking:
        time.sleep(0.001)  # the last one out of _PARKING: from its removal to its block


def _names(workers: list[ModelWorker]) -> str:
    return ", ".join(worker.name for worker in workers)


def _wait_for_threads(workers: list[ModelWorker], deadline: float) -> list[ModelWorker]:
    """Wait until the threads of ``workers`` have ended or parked, or until ``deadline``
    (``time.monotonic()``); return the workers whose thread has not."""
    for worker in workers:
        worker._wait_thread_done(deadline)
    return [worker for worker in workers if not worker._thread_done()]


class ModelWorker:
    """A single named daemon thread that runs submitted calls in order.

    The thread starts on first use and stops on :meth:`close`, after the calls already
    queued; calls submitted after ``close`` raise :class:`ModelClosedError`.

    Args:
        name: the thread's name (shows in logs, debuggers and ``threading.enumerate()``).
        park: once stopped, the thread does not end but waits, holding nothing, until the
            process exits: for engines whose per-thread state breaks when a thread that
            used it ends (MLX aborts the process at exit then, ml-explore/mlx#3126).
            Stopped is stopped either way: :attr:`stopped` resolves and ``close(wait=True)``
            returns.
    """

    def __init__(self, name: str = "genlm-model", *, park: bool = False):
        self.name = name
        self._park = park
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # makes "closed? start, queue" atomic with close()
        self._closed = False
        self._exiting = False  # the interpreter exits: queued calls are failed, not run
        #: Resolved once the thread has run its last call and left (or never started).
        self.stopped: concurrent.futures.Future[None] = concurrent.futures.Future()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the thread may still finish queued calls)."""
        return self._closed

    def on_worker_thread(self) -> bool:
        """Whether the caller is running on this worker's thread.

        Returns:
            True only on the worker's own thread.
        """
        return self._thread is not None and threading.current_thread() is self._thread

    def _run(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                self._execute(*item)
                # Waiting for the next call must not keep this one's loop, future,
                # arguments and result alive (one batch per model, held indefinitely).
                del item
        finally:
            self.stopped.set_result(None)

    def _execute(
        self,
        ctx: contextvars.Context,
        fn: Callable[..., Any],
        args: tuple,
        start: Callable[[], bool],
        deliver: Deliver,
    ) -> None:
        """Run one call and deliver its outcome; never raises (the thread must survive)."""
        try:
            if not start():  # cancelled before it started: nobody wants it
                return
            if self._exiting:  # only the call running at exit may finish (_stop_at_exit)
                deliver(None, ModelClosedError(f"{self.name} is closed: the program is exiting"))
                return
            try:
                result = ctx.run(fn, *args)
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
                deliver(None, self._transportable(exc))
            else:
                if type(result) is Requeue:
                    self._requeue(ctx, result, deliver)
                else:
                    deliver(result, None)
        except BaseException:  # noqa: BLE001 - a delivery failure must not stop the worker
            logger.exception("%s: could not deliver the outcome of %r", self.name, fn)

    def _requeue(self, ctx: contextvars.Context, later: Requeue, deliver: Deliver) -> None:
        """Queue the rest of a call behind the calls waiting now, with its context and its
        delivery; once closed, deliver :class:`ModelClosedError` instead (the thread stops
        after the calls queued before the close)."""
        with self._lock:
            if not self._closed:
                self._queue.put((ctx, later.fn, later.args, _always, deliver))
                return
        deliver(None, ModelClosedError(f"{self.name} is closed"))

    def has_waiting_calls(self) -> bool:
        """Whether a call is queued behind the running one (a long call may then return
        :class:`Requeue` to let it through). True once closed, with the stop queued."""
        return not self._queue.empty()

    def _transportable(self, exc: BaseException) -> BaseException:
        """``exc`` itself, or a :class:`BackendError` from it if a future cannot carry it."""
        if isinstance(exc, Exception) and not isinstance(exc, (StopIteration, StopAsyncIteration)):
            return exc
        logger.error(
            "%s: a call raised %s; its callers get a BackendError, the worker keeps serving",
            self.name,
            type(exc).__name__,
            exc_info=exc,
        )
        error = BackendError(f"{self.name}: the backend raised {type(exc).__name__}({exc})")
        error.__cause__ = exc
        return error

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """Queue ``fn(*args)``; return a thread-safe future of its result.

        Cancelling the future before the call starts skips the call.

        Args:
            fn: the function to run on the worker thread.
            *args: its positional arguments.

        Returns:
            A ``concurrent.futures.Future`` resolved with the result or the exception
            (see the module docstring for the exceptions that arrive wrapped).

        Raises:
            ModelClosedError: the worker is closed.
        """
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._put(fn, args, future.set_running_or_notify_cancel, _resolver(future))
        return future

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the worker and block until it finishes.

        Called from the worker thread itself (a backend calling back into the model),
        it runs inline instead of deadlocking, a :class:`Requeue` it returns too.

        Args:
            fn: the function to run on the worker thread.
            *args: its positional arguments.

        Returns:
            What ``fn`` returned.

        Raises:
            ModelClosedError: the worker is closed.
            BaseException: whatever ``fn`` raised (see the module docstring).
        """
        if self.on_worker_thread():
            result = fn(*args)
            while type(result) is Requeue:  # nothing runs in between: finish it here
                result = result.fn(*result.args)
            return result
        return self.submit(fn, *args).result()

    def run_async(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``fn(*args)`` and return an asyncio future resolved on the running loop.

        Cancelling the returned future only drops the outcome; the call still runs.

        Args:
            fn: the function to run on the worker thread.
            *args: its positional arguments.

        Returns:
            An asyncio future of the running loop, resolved on that loop's thread.

        Raises:
            ModelClosedError: the worker is closed.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def resolve(result: Any, exc: BaseException | None) -> None:
            if future.done():  # cancelled by its waiter meanwhile
                return
            if exc is None:
                future.set_result(result)
            else:
                future.set_exception(exc)

        self.run_then(loop, fn, args, resolve)
        return future

    def run_then(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], args: tuple, then: Deliver
    ) -> None:
        """Queue ``fn(*args)``; then call ``then(result, None)`` or ``then(None, exception)``
        on ``loop``'s thread (through ``call_soon_threadsafe``).

        The hand-back with no future: the scheduler resolves a whole batch's futures from
        ``then``, one loop callback after the outcome arrives instead of two. If ``loop`` has
        closed by then, the outcome is dropped (nobody can be waiting on that loop).

        Raises:
            ModelClosedError: the worker is closed (``then`` is never called).
        """

        def deliver(result: Any, exc: BaseException | None) -> None:
            try:
                loop.call_soon_threadsafe(then, result, exc)
            except RuntimeError:  # the loop closed while we worked: nobody is waiting
                logger.debug("%s: result dropped, event loop closed", self.name)

        self._put(fn, args, _always, deliver)

    def _put(
        self, fn: Callable[..., Any], args: tuple, start: Callable[[], bool], deliver: Deliver
    ) -> None:
        with self._lock:
            self._put_locked(fn, args, start, deliver)

    def _put_locked(
        self, fn: Callable[..., Any], args: tuple, start: Callable[[], bool], deliver: Deliver
    ) -> None:
        """Queue a call, starting the thread on first use (the lock is held)."""
        if self._closed:
            raise ModelClosedError(f"{self.name} is closed")
        if self._thread is None:
            thread = threading.Thread(
                target=_thread_main, args=([self._run], self._park), name=self.name, daemon=True
            )
            self._thread = thread
            try:
                thread.start()
            except RuntimeError:  # no thread was made: the next call tries again rather
                self._thread = None  # than wait on this one (an interrupted start keeps it)
                raise
            _STARTED.add(self)
            # Exit handlers run last registered, first: registered anew at each thread
            # start, the stop runs before the handlers that the engines imported until then
            # registered (torch's, multiprocessing's, which ends engine processes), so they
            # do not tear down what a running call still uses. A plain atexit rather than
            # threading's (concurrent.futures'): those run before the non-daemon threads are
            # joined, while the program may still use its models from them.
            atexit.unregister(_stop_at_exit)
            atexit.register(_stop_at_exit)
        self._queue.put((contextvars.copy_context(), fn, args, start, deliver))

    def close_after(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Queue ``fn()`` as the last call and close, in one step: a call another thread
        submits meanwhile is refused (:class:`ModelClosedError`) rather than run after
        ``fn`` (a model's release of its backend must be the last thing its worker runs).
        Does not wait; returns the future of ``fn``'s outcome.

        Raises:
            ModelClosedError: the worker was already closed (``fn`` is not run).
        """
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            self._put_locked(fn, (), future.set_running_or_notify_cancel, _resolver(future))
            self._close_locked()
        return future

    async def wait_stopped(self) -> None:
        """Wait, without blocking the event loop, until the thread has stopped.

        Cancelling this wait cancels only the wait; the thread stops regardless.
        """
        loop = asyncio.get_running_loop()
        stopped: asyncio.Future[None] = loop.create_future()
        # The done-callback stays on ``self.stopped`` for good (a concurrent future keeps
        # its callbacks), so it reaches the loop through this list, emptied after the wait:
        # a model must not keep every loop that ever awaited its close alive.
        waiting = [loop, stopped]

        def wake(_: concurrent.futures.Future) -> None:
            target = waiting[:]  # one atomic copy: the wait may end meanwhile
            if not target:
                return
            try:
                target[0].call_soon_threadsafe(_resolve, target[1])
            except RuntimeError:  # that loop is closed: nobody is waiting
                pass

        self.stopped.add_done_callback(wake)
        try:
            await stopped
        finally:
            waiting.clear()

    def close(self, wait: bool = True) -> None:
        """Refuse new calls, finish the queued ones, then stop the thread. Idempotent.

        Args:
            wait: block until the thread has stopped. Every call with ``wait`` (not only
                the first) waits, except on the worker thread itself, which cannot.
        """
        with self._lock:
            self._close_locked()
            thread = self._thread
        if wait and thread is not None and threading.current_thread() is not thread:
            if self._park:
                self.stopped.result()  # a parked thread never ends
            else:
                thread.join()

    def _close_for_exit(self) -> None:
        """Close at exit (:func:`_stop_at_exit`): the running call finishes, the queued ones
        fail with :class:`ModelClosedError` instead of running."""
        self._exiting = True
        self.close(wait=False)

    def _thread_done(self) -> bool:
        """Whether the thread has ended (or never ran in this process: a forked child), or
        parked for good (``park=True``)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return True
        return self._park and self.stopped.done() and thread.ident not in _PARKING

    def _wait_thread_done(self, deadline: float) -> None:
        """Wait until :meth:`_thread_done` or ``deadline`` (``time.monotonic()``)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        if not self._park:
            thread.join(max(0.0, deadline - time.monotonic()))
            return
        concurrent.futures.wait([self.stopped], max(0.0, deadline - time.monotonic()))
        while not self._thread_done() and time.monotonic() < deadline:
            time.sleep(0.001)  # from leaving the queue to blocking: a few bytecodes

    def _close_locked(self) -> None:
        """Refuse new calls and queue the thread's stop behind the queued ones, once (the
        lock is held)."""
        if not self._closed:
            self._closed = True
            if self._thread is None:
                self.stopped.set_result(None)
            else:
                if self._park:  # on its way to park from now on (see _stop_at_exit)
                    _PARKING.add(self._thread.ident)
                self._queue.put(_STOP)
