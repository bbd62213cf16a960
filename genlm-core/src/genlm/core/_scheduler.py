"""The one autobatching scheduler every backend uses.

Concurrent ``await batcher.submit(item)`` calls are gathered into batches and run on
the model's worker thread, so the event loop stays free while a backend computes.

Policy, in order:

* **Dedup.** Items with the same key share one computation: a request whose key is
  already queued or in flight just joins its waiters.
* **Firing.** A batch fires as soon as ``max_batch_size`` distinct items are queued, or
  ``max_wait_s`` after the *first* queued item arrived (the timer is never pushed back
  by later arrivals). While a batch is in flight on the worker, a partial batch waits for
  it to finish (it could not start earlier anyway) and so grows; a full batch is handed
  to the worker at once.
* **Groups.** Items carry a group (e.g. the active LoRA adapter); a batch never mixes
  groups.
* **Fan-out.** Each waiter has its own future: a result or the batch's exception reaches
  every waiter of that batch, and a cancelled waiter never cancels the computation the
  others wait for. Items whose waiters have all been cancelled are dropped before firing.
* **Event loops.** State is kept per event loop, so a model can serve successive
  ``asyncio.run`` calls. No task is ever created; the only loop resource is one timer
  handle, cancelled by :meth:`AutoBatcher.aclose`.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

import attrs

from genlm.core._errors import ModelClosedError
from genlm.core._worker import ModelWorker

logger = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741 - an item
R = TypeVar("R")  # its result


@attrs.define(eq=False)
class _Entry:
    """One distinct queued item and the futures of everyone waiting for it."""

    item: Any
    key: Hashable
    group: Hashable
    waiters: list[asyncio.Future] = attrs.field(factory=list)

    def live(self) -> bool:
        return any(not w.done() for w in self.waiters)


@attrs.define(eq=False)
class _LoopState:
    """Scheduler state that belongs to one event loop."""

    loop: asyncio.AbstractEventLoop
    pending: dict[Hashable, _Entry] = attrs.field(factory=dict)
    in_flight: dict[Hashable, _Entry] = attrs.field(factory=dict)
    timer: asyncio.TimerHandle | None = None
    batches_in_flight: int = 0


def _deliver(entry: _Entry, result: Any = None, exc: BaseException | None = None) -> None:
    for waiter in entry.waiters:
        if waiter.done():
            continue
        if exc is None:
            waiter.set_result(result)
        else:
            waiter.set_exception(exc)


class AutoBatcher(Generic[I, R]):
    """Gathers concurrent requests into batches for a synchronous batch function.

    Args:
        run_batch: called on the worker thread with a list of items of one group;
            returns one result per item, in order.
        worker: the model's worker thread.
        max_batch_size: most distinct items in one batch.
        max_wait_s: longest time the first queued item waits for company.
        key: the dedup key of an item (items with equal keys are computed once);
            ``None`` disables dedup.
        group: the group of an item; a batch holds items of one group.
        on_result: called on the event loop with ``(item, result)`` once per computed
            item, before waiters resume (the output cache uses it).
    """

    def __init__(
        self,
        run_batch: Callable[[list[I]], Sequence[R]],
        worker: ModelWorker,
        *,
        max_batch_size: int = 32,
        max_wait_s: float = 0.001,
        key: Callable[[I], Hashable] | None = None,
        group: Callable[[I], Hashable] | None = None,
        on_result: Callable[[I, R], None] | None = None,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        self.run_batch = run_batch
        self.worker = worker
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._key = key
        self._group = group
        self._on_result = on_result
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )
        self._closed = False
        #: Counters for tests and benchmarks: batches run and items computed.
        self.stats = {"batches": 0, "items": 0}

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            state = self._states[loop] = _LoopState(loop)
        return state

    def submit(self, item: I) -> asyncio.Future[R]:
        """Queue ``item``; return a future of its result, owned by this caller alone.

        Cancelling the returned future (or the task awaiting it) withdraws only this
        caller's interest.
        """
        if self._closed:
            raise ModelClosedError("this model is closed")
        state = self._state()
        waiter: asyncio.Future[R] = state.loop.create_future()
        key = self._key(item) if self._key is not None else object()
        entry = state.in_flight.get(key) or state.pending.get(key)
        if entry is not None:
            entry.waiters.append(waiter)
            return waiter
        group = self._group(item) if self._group is not None else None
        entry = _Entry(item, key, group, [waiter])
        state.pending[key] = entry
        if len(state.pending) >= self.max_batch_size:
            self._flush(state)
        elif state.timer is None:
            state.timer = state.loop.call_later(self.max_wait_s, self._on_timer, state)
        return waiter

    def _on_timer(self, state: _LoopState) -> None:
        state.timer = None
        self._flush(state, partial=True)

    def _flush(self, state: _LoopState, partial: bool = False) -> None:
        """Fire every full batch, and a partial one if allowed and the worker is idle."""
        while state.pending:
            for key in [k for k, e in state.pending.items() if not e.live()]:
                del state.pending[key]
            if not state.pending:
                break
            first = next(iter(state.pending.values()))
            batch = [e for e in state.pending.values() if e.group == first.group]
            batch = batch[: self.max_batch_size]
            full = len(batch) == self.max_batch_size
            if not full and not (partial and state.batches_in_flight == 0):
                break
            self._fire(state, batch)
        if state.pending and state.timer is None and state.batches_in_flight == 0:
            state.timer = state.loop.call_later(self.max_wait_s, self._on_timer, state)
        elif not state.pending and state.timer is not None:
            state.timer.cancel()
            state.timer = None

    def _fire(self, state: _LoopState, batch: list[_Entry]) -> None:
        for entry in batch:
            del state.pending[entry.key]
            state.in_flight[entry.key] = entry
        state.batches_in_flight += 1
        items = [e.item for e in batch]
        try:
            future = self.worker.run_async(self._run, items)
        except BaseException as exc:  # worker closed: fail this batch, keep the loop sane
            self._finish(state, batch, None, exc)
            return
        future.add_done_callback(
            lambda f: self._finish(state, batch, *_outcome(f)),
        )

    def _run(self, items: list[I]) -> Sequence[R]:
        results = self.run_batch(items)
        if len(results) != len(items):
            raise RuntimeError(
                f"backend returned {len(results)} results for a batch of {len(items)}"
            )
        return results

    def _finish(
        self,
        state: _LoopState,
        batch: list[_Entry],
        results: Sequence[R] | None,
        exc: BaseException | None,
    ) -> None:
        state.batches_in_flight -= 1
        self.stats["batches"] += 1
        self.stats["items"] += len(batch)
        for i, entry in enumerate(batch):
            state.in_flight.pop(entry.key, None)
            if exc is None:
                result = results[i]
                if self._on_result is not None:
                    self._on_result(entry.item, result)
                _deliver(entry, result)
            else:
                _deliver(entry, exc=exc)
        if exc is not None:
            logger.debug("batch of %d failed: %r", len(batch), exc)
        if not self._closed:
            self._flush(state, partial=True)

    def reject_new(self) -> None:
        """Refuse further submissions and fail the queued ones with ModelClosedError.

        For closing from any thread: each loop's queued requests are failed on that
        loop's own thread (the running batches finish normally).
        """
        self._closed = True
        for state in list(self._states.values()):
            try:
                state.loop.call_soon_threadsafe(self._fail_pending, state)
            except RuntimeError:  # that loop is closed: nobody can be waiting on it
                pass

    def _fail_pending(self, state: _LoopState) -> None:
        """On ``state``'s loop: fail its queued requests and cancel its timer."""
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        closed = ModelClosedError("the model was closed before this request ran")
        for entry in state.pending.values():
            _deliver(entry, exc=closed)
        state.pending.clear()

    async def aclose(self) -> None:
        """Fail queued requests, wait for in-flight batches, cancel timers. Idempotent."""
        self.reject_new()
        closed = ModelClosedError("the model was closed before this request ran")
        for state in list(self._states.values()):
            if state.timer is not None:
                state.timer.cancel()
                state.timer = None
            for entry in state.pending.values():
                _deliver(entry, exc=closed)
            state.pending.clear()
        try:
            state = self._state()
        except RuntimeError:
            return
        while state.batches_in_flight:
            await asyncio.sleep(0.001)


def _outcome(future: asyncio.Future) -> tuple[Any, BaseException | None]:
    if future.cancelled():
        return None, asyncio.CancelledError()
    exc = future.exception()
    return (None, exc) if exc is not None else (future.result(), None)
