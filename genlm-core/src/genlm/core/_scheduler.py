"""The one autobatching scheduler every backend uses.

Concurrent ``await batcher.submit(item)`` calls are gathered into batches and run on
the model's worker thread, so the event loop stays free while a backend computes.
:meth:`AutoBatcher.run_sync` computes items for a blocking caller with the same grouping,
deduplication, chunking and pick-up.

Policy, in order:

* **Dedup.** Items with the same key share one computation: a request whose key is
  already queued or in flight just joins its waiters.
* **Groups.** Items carry a group (e.g. the active LoRA adapter); a batch never mixes
  groups. Each group has its own queue, oldest request first.
* **Firing.** No batch waits on a timer by default. A group's batch fires as soon as
  both hold: the event loop has run every callback that was ready when its requests
  arrived (the first queued request schedules the flush with ``loop.call_soon``, which
  runs after them, so every task of an ``asyncio.gather`` has submitted), and the worker
  has room under ``max_in_flight``. A full batch (``max_batch_size`` live requests) fires
  at once when there is room (those of one :meth:`AutoBatcher.submit_many` call once all
  its items are queued, so the worker wakes once for them). While the worker has no
  room, requests keep queueing, deduplicating and growing the next batch, which fires
  when a running batch finishes.
  With ``max_wait_s > 0`` (for callers that trickle in), a partial batch also waits
  until ``max_wait_s`` after its group's *oldest* request arrived (arrivals never push
  that back; one timer per event loop, armed for the oldest request while there is
  room). The rule is applied to every group, so one group's lone request never holds up
  another group's full batch; when several batches may fire, the one holding the oldest
  request goes first, in the style of vLLM and SGLang, which schedule what is queued
  whenever the engine is free.
* **Backpressure.** At most ``max_in_flight`` batches per event loop are handed to the
  worker (one running, one ready, by default); the rest stay queued, where they keep
  growing and deduplicating.
* **Cancellation.** Each waiter has its own future: a result or the batch's exception
  reaches every waiter of that batch, and a cancelled waiter never cancels the
  computation the others wait for. Work nobody waits for is skipped: queued requests
  whose waiters all cancelled are dropped before firing, and when the worker picks a
  batch up it drops the entries whose waiters all cancelled since it was handed over
  (a batch left empty is not run). A request joining a dropped entry starts afresh.
  While the worker has no room, cancelled waiters and entries are also dropped as new
  ones arrive (amortized), so a caller retrying with timeouts does not pile them up.
  Cancelling during the backend's computation does not interrupt it.
* **Event loops.** State is kept per event loop, so a model serves successive
  ``asyncio.run`` calls, and loops in several threads at once. A loop's state is held
  only by its scheduled flush, its timer and its running batches, so it is freed with
  the loop. Closing fails each loop's queued requests on that loop's own thread
  (``call_soon_threadsafe``). No task is ever created.

Threads: everything runs on the owning loop's thread except two steps of the worker's
pick-up, done under the batcher's lock: reading whether an entry's waiters are done, and
marking the entry dropped (a request joins an in-flight entry under the same lock).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

import attrs

from genlm.core._errors import BackendError, ModelClosedError
from genlm.core._validation import checked_count, checked_seconds
from genlm.core._worker import ModelWorker, Requeue

logger = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741 - an item
R = TypeVar("R")  # its result

#: The futures ``submit`` returns, made directly: ``loop.create_future`` is a Python call
#: per request that makes the same object on asyncio's own loops.
_Future = asyncio.Future

#: What a waiter may be: an asyncio future (``submit``) or a thread-safe one (``run_sync``).
Waiter = asyncio.Future | concurrent.futures.Future


#: The least sizes at which a waiter list and a queue drop their cancelled members. A
#: queue's is above a usual gather (an SMC step's), which never scans.
_PRUNE_WAITERS = 8
_PRUNE_QUEUE = 256


class _Queue(dict):
    """A group's queued entries, an insertion-ordered set (``dict[_Entry, None]``), and the
    size at which its dead entries are dropped (:func:`_next_prune`)."""

    __slots__ = ("prune_at",)

    def __init__(self) -> None:
        super().__init__()
        self.prune_at = _PRUNE_QUEUE


@attrs.define(eq=False)
class _Entry:
    """One distinct item and the futures of everyone waiting for it."""

    item: Any
    key: Hashable
    group: Hashable
    #: Loop time of arrival: a partial batch holding this entry may fire from
    #: ``arrival + max_wait_s`` on (the option's value then, so a change applies to
    #: queued requests too); it also orders batches, oldest first.
    arrival: float
    waiters: list[Waiter]
    #: The queues' :attr:`_Queues.round` when the entry was queued: its arrival flush has
    #: run once the queues' round is past it.
    round: int = 0
    #: Closed to joiners (a request for its key starts an entry of its own): set by the
    #: worker when, at pick-up, nobody waited any more, or by
    #: :meth:`AutoBatcher.refuse_joins` when it was in flight at a change of the model.
    dropped: bool = False
    #: The number of waiters at which the cancelled ones are dropped (:func:`_next_prune`).
    prune_at: int = _PRUNE_WAITERS

    def live(self) -> bool:
        for waiter in self.waiters:
            if not waiter.done():
                return True
        return False


@attrs.define(eq=False)
class _Queues:
    """Entries waiting to be batched: by key (for dedup) and by group, oldest first."""

    #: Every queued or in-flight entry, by key.
    entries: dict[Hashable, _Entry] = attrs.field(factory=dict)
    #: Queued entries by group, each an insertion-ordered set, oldest first (keyed by the
    #: entry itself: an identity hash costs less than hashing a long key again).
    queues: dict[Hashable, _Queue] = attrs.field(factory=dict)
    #: Counts the arrival flushes that have run: a partial batch holds only entries whose
    #: round is below it (every request queued with them has arrived).
    round: int = 1


@attrs.define(eq=False)
class _LoopState(_Queues):
    """Scheduler state that belongs to one event loop (held weakly by the batcher)."""

    loop: weakref.ref[asyncio.AbstractEventLoop] = attrs.field(kw_only=True)
    #: Batches handed to the worker and not finished.
    running: int = 0
    #: Resolved when ``running`` falls to 0, for :meth:`AutoBatcher.aclose` (made by it).
    idle: asyncio.Future[None] | None = None
    #: The flush scheduled with ``call_soon`` by the first request queued since the last.
    soon: asyncio.Handle | None = None
    #: The ``max_wait_s`` timer, armed for the oldest queued request.
    timer: asyncio.TimerHandle | None = None


def _on_each_loop(states: Sequence[_LoopState], callback: Callable[..., Any], *args: Any) -> None:
    """``callback(state, *args)`` for each state, on its event loop's thread: at once for
    the calling thread's running loop, else through ``call_soon_threadsafe``. A closed
    loop's state is skipped: nobody can await its futures."""
    try:
        current = asyncio.get_running_loop()
    except RuntimeError:
        current = None
    for state in states:
        loop = state.loop()
        if loop is None:
            continue
        if loop is current:
            callback(state, *args)
            continue
        try:
            loop.call_soon_threadsafe(callback, state, *args)
        except RuntimeError:  # the loop is closed
            logger.debug("%s skipped for a closed event loop", callback.__name__)


def _forget(queues: _Queues, entry: _Entry) -> None:
    """Remove ``entry`` from the dedup map, unless a newer entry took its key (after the
    worker dropped it)."""
    # One lookup, then a delete only of this entry: the newer entry that took the key is
    # never out of the map, so refuse_joins (another thread) always sees it.
    if queues.entries.get(entry.key) is entry:
        del queues.entries[entry.key]


def _next_prune(live: int, least: int) -> int:
    """The size at which a list left with ``live`` members after a scan is scanned again.

    While the worker has no room, nothing else drops cancelled waiters or dead entries (a
    caller retrying with timeouts would add one per retry for as long as a batch runs,
    unbounded if the backend hangs). Scanning again only once the list has doubled from
    what the scan kept makes each scan's cost at most the arrivals since the last one
    (O(1) per request, however many are live), and leaves at most about twice as many
    members as are live (or ``least``)."""
    return max(least, 2 * live)


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
            returns one result per item, in order (another count fails the batch's
            waiters with :class:`~genlm.core.BackendError` naming it). A model that holds
            its batcher passes its method as a ``weakref.WeakMethod``, so that the batcher
            does not keep it alive (dropped without ``close()``, it is freed by reference
            counting alone); a batch that runs after the model was freed fails its waiters
            with :class:`~genlm.core.ModelClosedError`. A long run may return a
            :class:`~genlm.core.backend.Requeue` to let the worker's other calls through;
            the batch stays in flight until its last part returns the results.
        worker: the model's worker thread.
        max_batch_size: most distinct items in one batch.
        max_wait_s: how long a partial batch waits for company after its oldest request
            (0, the default: no wait; it fires once the loop has run the callbacks that
            were ready when its requests arrived and the worker has room).
        key: the dedup key of an item (items with equal keys are computed once);
            ``None`` disables dedup.
        group: the group of an item; a batch holds items of one group.
        on_results: called on the event loop with ``(items, results)`` once per batch
            computed, before its waiters resume (the output cache stores the rows); if it
            raises, that batch's waiters get the exception.
        max_in_flight: most batches per event loop handed to the worker at once.

    The three options may be set again later (the attributes of the same names), from
    any thread; every value is checked where it is set, and requests already queued
    follow the new values (a partial batch waits ``max_wait_s`` as it is now after its
    oldest request's arrival).

    Raises:
        TypeError: ``max_batch_size`` or ``max_in_flight`` not an integer, or
            ``max_wait_s`` not a number.
        ValueError: ``max_batch_size`` or ``max_in_flight`` below 1, or ``max_wait_s``
            negative, infinite or NaN.
    """

    def __init__(
        self,
        run_batch: Callable[[list[I]], Sequence[R] | Requeue] | weakref.WeakMethod,
        worker: ModelWorker,
        *,
        max_batch_size: int = 32,
        max_wait_s: float = 0.0,
        key: Callable[[I], Hashable] | None = None,
        group: Callable[[I], Hashable] | None = None,
        on_results: Callable[[list[I], Sequence[R]], Any] | None = None,
        max_in_flight: int = 2,
    ):
        self.run_batch = run_batch
        self.worker = worker
        self._key = key
        self._group = group
        self._on_results = on_results
        # Keyed by id(loop): a value that is alive keeps the loop alive through its
        # futures, so the batcher holds neither strongly (see _LoopState.loop).
        self._states: weakref.WeakValueDictionary[int, _LoopState] = weakref.WeakValueDictionary()
        #: The state of the loop that registered last: ``submit`` tries it first, which
        #: costs a weakref call instead of a WeakValueDictionary lookup.
        self._last: weakref.ref[_LoopState] | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.max_in_flight = max_in_flight
        #: Counters for tests and benchmarks: batches run and items computed.
        self.stats = {"batches": 0, "items": 0}

    # The options are read on every request as plain attributes (``_max_batch_size``...);
    # the properties check a value when it is set, and have every event loop apply the
    # firing rule again to what it has queued (see _reapply).

    @property
    def max_batch_size(self) -> int:
        """Most distinct items in one batch."""
        return self._max_batch_size

    @max_batch_size.setter
    def max_batch_size(self, value: int) -> None:
        self._max_batch_size = checked_count("max_batch_size", value, 1)
        self._options_changed()

    @property
    def max_wait_s(self) -> float:
        """Longest wait of a partial batch after its oldest request (0: none)."""
        return self._max_wait_s

    @max_wait_s.setter
    def max_wait_s(self, value: float) -> None:
        self._max_wait_s = checked_seconds("max_wait_s", value)
        self._options_changed()

    @property
    def max_in_flight(self) -> int:
        """Most batches per event loop handed to the worker at once."""
        return self._max_in_flight

    @max_in_flight.setter
    def max_in_flight(self, value: int) -> None:
        self._max_in_flight = checked_count("max_in_flight", value, 1)
        self._options_changed()

    def _options_changed(self) -> None:
        """Have each event loop apply the firing rule again to its queued requests under
        the options just set (on that loop's thread; at once for the calling thread's
        running loop), so that a lowered ``max_wait_s`` or a raised ``max_in_flight``
        takes effect for requests already waiting. Safe from any thread."""
        with self._lock:
            states = [state for state in self._states.values() if state.queues]
        _on_each_loop(states, self._reapply)

    def _reapply(self, state: _LoopState) -> None:
        """Fire what the current options allow now and re-arm the timer for them."""
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        self._flush(state, asyncio.get_running_loop().time())

    def _state(self, loop: asyncio.AbstractEventLoop) -> _LoopState:
        """The loop's state, registered if new; refuses once closed.

        The closed check and the registration are one step under the lock, which
        :meth:`reject_new` also takes to close and list the states: a request either
        sees the batcher closed, or its loop's state is listed and its queue failed.
        """
        with self._lock:
            if self._closed:
                raise ModelClosedError("this model is closed")
            state = self._states.get(id(loop))
            if state is None or state.loop() is not loop:  # none yet, or a dead loop's id
                state = self._states[id(loop)] = _LoopState(loop=weakref.ref(loop))
            self._last = weakref.ref(state)
            return state

    def submit(self, item: I) -> asyncio.Future[R]:
        """Queue ``item``; return a future of its result, owned by this caller alone.

        Cancelling the returned future (or the task awaiting it) withdraws only this
        caller's interest.

        Args:
            item: the input to compute; with a ``key`` function, an item whose key is
                already pending on this event loop is joined rather than computed again.

        Returns:
            A future, on the running event loop, of ``item``'s result (or of the exception
            its batch raised).

        Raises:
            ModelClosedError: the batcher was closed.
        """
        loop = asyncio.get_running_loop()
        state = self._loop_state(loop)
        waiter: asyncio.Future[R] = _Future(loop=loop)
        queue = self._enqueue(state, item, waiter, loop.time())
        if queue is not None:  # queued anew, else it joined a pending entry
            full = len(queue) >= self._max_batch_size
            # _arrived has nothing to do for a partial batch whose flush is scheduled.
            if full or state.soon is None:
                self._arrived(state, loop, full)
        return waiter

    def submit_many(self, items: Sequence[I]) -> list[asyncio.Future[R]]:
        """:meth:`submit` each of ``items``, in order, as if they arrived together (one
        lookup of the loop's state, one arrival time); a future per item."""
        loop = asyncio.get_running_loop()
        state, arrival = self._loop_state(loop), loop.time()
        enqueue = self._enqueue
        waiters = []
        full = queued = False
        try:
            for item in items:
                waiters.append(waiter := _Future(loop=loop))
                queue = enqueue(state, item, waiter, arrival)
                if queue is not None:
                    queued = True
                    full = full or len(queue) >= self._max_batch_size
        except BaseException:
            # An item's key or group raised: nobody gets these futures, so their work is
            # skipped unless others joined it; what was queued still gets its flush.
            for waiter in waiters:
                waiter.cancel()
            raise
        finally:
            # Full batches fire once every item is queued, back to back: the worker wakes
            # once for all of them instead of contending with this loop mid-way.
            if queued:
                self._arrived(state, loop, full)
        return waiters

    def _loop_state(self, loop: asyncio.AbstractEventLoop) -> _LoopState:
        """The state of ``loop``: the last registered one when it is that loop's (a weakref
        call), else :meth:`_state`'s, which registers it or refuses once closed."""
        last = self._last
        state = last() if last is not None else None
        if state is None or state.loop() is not loop or self._closed:
            state = self._state(loop)
        return state

    def _arrived(self, state: _LoopState, loop: asyncio.AbstractEventLoop, full: bool) -> None:
        """Apply the firing rule after new entries were queued: full batches fire now if
        the worker has room (the rest may grow); the flush of partial batches is scheduled
        with ``call_soon``, after every callback ready now, unless already scheduled."""
        if full and state.running < self._max_in_flight:
            self._flush(state, loop.time())
        if state.queues and state.soon is None:
            state.soon = loop.call_soon(self._on_soon, state)

    def _enqueue(self, queues: _Queues, item: I, waiter: Waiter, arrival: float) -> _Queue | None:
        """Join ``item``'s pending entry, or queue a new one; return its group's queue
        if a new entry was queued, None if it joined."""
        key = self._key(item) if self._key is not None else object()
        group = self._group(item) if self._group is not None else None
        # Looked up first: a key or group that cannot be hashed fails before any change.
        queue = queues.queues.get(group)
        entry = _Entry(item, key, group, arrival, [waiter], queues.round)
        pending = queues.entries.setdefault(key, entry)  # one hash of the key, new or not
        if pending is not entry:
            with self._lock:
                # A queued entry is not in flight whatever ``dropped`` says (refuse_joins may
                # mark one that _enqueue has mapped but not yet queued): join it.
                if not pending.dropped or pending in queues.queues.get(pending.group, ()):
                    waiters = pending.waiters
                    waiters.append(waiter)
                    if len(waiters) >= pending.prune_at:
                        pending.waiters = waiters = [w for w in waiters if not w.done()]
                        pending.prune_at = _next_prune(len(waiters), _PRUNE_WAITERS)
                    return None
            queues.entries[key] = entry  # the pending one was dropped: start afresh
        if queue is None:
            queue = queues.queues[group] = _Queue()
        queue[entry] = None
        if len(queue) >= queue.prune_at:
            for dead in [e for e in queue if not e.live()]:
                del queue[dead]
                _forget(queues, dead)
            queue.prune_at = _next_prune(len(queue), _PRUNE_QUEUE)
        return queue

    def _head(self, queues: _Queues, group: Hashable) -> list[_Entry]:
        """The group's next batch: up to ``max_batch_size`` live entries, oldest first.

        Entries met on the way whose waiters all cancelled are dropped from the queue.
        """
        queue = queues.queues[group]
        batch: list[_Entry] = []
        dead: list[_Entry] = []
        for entry in queue:
            if not entry.live():
                dead.append(entry)
            elif len(batch) < self._max_batch_size:
                batch.append(entry)
            else:
                break
        for entry in dead:
            del queue[entry]
            _forget(queues, entry)
        if not queue:
            del queues.queues[group]
        return batch

    def _take(self, queues: _Queues, now: float) -> list[_Entry] | None:
        """Remove and return the batch to fire now, or None: a group's full batch, or a
        partial one of the requests whose arrival flush has run (requests of this loop
        iteration wait for theirs: a ``gather`` still submitting is never cut), once its
        oldest is due at ``now``; the batch holding the oldest request first."""
        best = None
        for group in list(queues.queues):
            batch = self._head(queues, group)
            if not batch:
                continue
            if len(batch) < self._max_batch_size:
                if batch[-1].round >= queues.round:  # rounds rise along a queue
                    batch = [entry for entry in batch if entry.round < queues.round]
                if not batch or batch[0].arrival + self._max_wait_s > now:
                    continue
            if best is None or batch[0].arrival < best[0].arrival:
                best = batch
        if best is not None:
            queue = queues.queues[best[0].group]
            for entry in best:
                del queue[entry]
            if not queue:
                del queues.queues[best[0].group]
        return best

    def _on_soon(self, state: _LoopState) -> None:
        state.soon = None
        state.round += 1  # every request queued before this callback has arrived
        self._flush(state, asyncio.get_running_loop().time())

    def _flush(self, state: _LoopState, now: float) -> None:
        """Fire every batch the rule allows at time ``now``, then arm or cancel the
        ``max_wait_s`` timer.

        ``now``: deadlines up to it count as passed (a partial batch holds only requests
        whose arrival flush has run, see :meth:`_take`).
        """
        if self._closed:
            return
        while state.running < self._max_in_flight:
            batch = self._take(state, now)
            if batch is None:
                break
            self._fire(state, batch)
        if self._max_wait_s and state.queues and state.running < self._max_in_flight:
            self._arm(state)  # partial batches not yet due are left
        elif state.timer is not None:
            state.timer.cancel()
            state.timer = None

    def _arm(self, state: _LoopState) -> None:
        """Arm the loop's one timer for the oldest queued request's deadline."""
        deadline = min(next(iter(q)).arrival for q in state.queues.values()) + self._max_wait_s
        if state.timer is not None:
            if state.timer.when() <= deadline:
                return
            state.timer.cancel()
        loop = asyncio.get_running_loop()
        state.timer = loop.call_at(deadline, self._on_timer, state, deadline)

    def _on_timer(self, state: _LoopState, deadline: float) -> None:
        state.timer = None
        self._flush(state, max(asyncio.get_running_loop().time(), deadline))

    def _fire(self, state: _LoopState, batch: list[_Entry]) -> None:
        try:
            self.worker.run_then(
                asyncio.get_running_loop(),
                self._pick_up_and_run,
                (batch,),
                functools.partial(self._finish, state, batch),
            )
        except BaseException as exc:  # worker closed: fail this batch, keep the loop sane
            self._deliver_batch(state, batch, None, exc, None)
            return
        state.running += 1

    def _pick_up_and_run(self, batch: list[_Entry]) -> tuple[list[_Entry], Sequence[R]] | Requeue:
        """Worker-thread side: skip entries nobody waits for any more, run the rest."""
        with self._lock:
            live = []
            for entry in batch:
                if entry.live():
                    live.append(entry)
                else:
                    entry.dropped = True
        if not live:
            return live, []
        run_batch = self.run_batch
        if type(run_batch) is weakref.WeakMethod:
            run_batch = run_batch()
            if run_batch is None:
                raise ModelClosedError("the model was dropped before this request ran")
        return self._outcome(live, run_batch([e.item for e in live]), run_batch)

    def _outcome(
        self, live: list[_Entry], results: Sequence[R] | Requeue, run_batch: Callable[..., Any]
    ) -> tuple[list[_Entry], Sequence[R]] | Requeue:
        """The batch's outcome once ``run_batch`` has returned: its results, checked, or,
        for a :class:`Requeue` (a long run making way on the worker), the rest of the run
        requeued, whose results are checked when it ends."""
        if type(results) is Requeue:
            return Requeue(self._resume, (live, results, run_batch))
        if len(results) != len(live):
            name = getattr(run_batch, "__qualname__", repr(run_batch))
            raise BackendError(
                f"{name} returned {len(results)} results for a batch of {len(live)}; "
                "run_batch must return one result per item"
            )
        return live, results

    def _resume(
        self, live: list[_Entry], later: Requeue, run_batch: Callable[..., Any]
    ) -> tuple[list[_Entry], Sequence[R]] | Requeue:
        """Run the requeued rest of a batch's run (worker thread)."""
        return self._outcome(live, later.fn(*later.args), run_batch)

    def _finish(
        self,
        state: _LoopState,
        batch: list[_Entry],
        outcome: tuple[list[_Entry], Sequence[R]] | None,
        exc: BaseException | None,
    ) -> None:
        """Loop side of a batch's end (the worker's ``then``): resolve its waiters, then fire
        what the freed slot allows."""
        state.running -= 1
        if not state.running and state.idle is not None:
            state.idle.set_result(None)  # awaited only through shield: never cancelled
            state.idle = None
        self._deliver_batch(state, batch, outcome, exc, self._on_results)
        if state.soon is None:  # else requests are still arriving: the flush comes soon
            self._flush(state, asyncio.get_running_loop().time())

    def _deliver_batch(
        self,
        queues: _Queues,
        batch: list[_Entry],
        outcome: tuple[list[_Entry], Sequence[R]] | None,
        exc: BaseException | None,
        on_results: Callable[[list[I], Sequence[R]], Any] | None,
    ) -> BaseException | None:
        """Resolve the waiters of a batch, calling ``on_results`` first; return what failed
        the batch (``exc``, or what ``on_results`` raised), None if it succeeded."""
        for entry in batch:
            _forget(queues, entry)
        if exc is not None:
            logger.debug("batch of %d failed: %r", len(batch), exc)
            for entry in batch:
                _deliver(entry, exc=exc)
            return exc
        live, results = outcome  # type: ignore[misc] - set when exc is None
        if live:
            self.stats["batches"] += 1
            self.stats["items"] += len(live)
        if on_results is not None and live:
            try:
                on_results([entry.item for entry in live], results)
            except Exception as error:  # noqa: BLE001 - fail this batch's waiters, not the loop
                for entry in live:
                    _deliver(entry, exc=error)
                return error
        for entry, result in zip(live, results):
            _deliver(entry, result)
        return None

    def run_sync(self, items: Sequence[I], *, notify: bool = True) -> list[R]:
        """Compute ``items`` now, blocking the calling thread; one result per item, in order.

        Items are deduplicated, grouped and cut into batches of at most
        ``max_batch_size`` like queued requests (the oldest request first), and each batch runs
        on the worker (inline when called on the worker thread itself). Nothing is shared
        with the event loops' queues.

        Args:
            items: the inputs to compute.
            notify: call ``on_results`` for each computed batch, as ``submit`` does; False
                keeps the results to this caller (the uncached path).

        Returns:
            The results, ``results[i]`` for ``items[i]``.

        Raises:
            ModelClosedError: the batcher or the worker was closed.
            Exception: what the first failing batch raised; later batches are not run.
        """
        if self._closed:
            raise ModelClosedError("this model is closed")
        queues = _Queues()
        waiters: list[concurrent.futures.Future[R]] = []
        for order, item in enumerate(items):
            waiters.append(concurrent.futures.Future())
            self._enqueue(queues, item, waiters[-1], float(order))
        queues.round += 1  # every item has arrived
        on_results = self._on_results if notify else None
        while (batch := self._take(queues, float("inf"))) is not None:
            outcome = self.worker.call(self._pick_up_and_run, batch)
            error = self._deliver_batch(queues, batch, outcome, None, on_results)
            if error is not None:  # on_results failed: the later batches are not run
                raise error
        return [waiter.result() for waiter in waiters]

    def refuse_joins(self) -> None:
        """Close every computation in flight, on every event loop, to requests made from
        now on: each starts one of its own.

        For a change of the model (:meth:`BatchedLM.clear_cache`): a batch handed to the
        worker before the change computes from the old state, and a request made after the
        change must not share its result. Queued requests are not in flight: they run
        after the change. Safe from any thread.
        """
        with self._lock:  # a join reads ``dropped`` under the same lock
            for state in list(self._states.values()):
                queues = state.queues
                for entry in list(state.entries.values()):  # one C call: no race with its loop
                    if entry not in queues.get(entry.group, ()):
                        entry.dropped = True

    def _fail_queued(self, state: _LoopState, exc: BaseException) -> None:
        """Fail every queued request of ``state``, cancel its flush and timer (on its loop's
        thread)."""
        for handle in (state.soon, state.timer):
            if handle is not None:
                handle.cancel()
        state.soon = state.timer = None
        for queue in state.queues.values():
            for entry in queue:
                _forget(state, entry)
                _deliver(entry, exc=exc)
        state.queues.clear()

    def reject_new(self) -> None:
        """Refuse new requests and fail the queued ones with ``ModelClosedError``.

        Safe from any thread: each loop's requests are failed on that loop's thread
        (at once for the calling thread's running loop); a closed loop's are forgotten.
        Batches already handed to the worker still run. Idempotent.
        """
        closed = ModelClosedError("the model was closed before this request ran")
        with self._lock:  # atomic with _state's check-and-register
            self._closed = True
            states = list(self._states.values())
        _on_each_loop(states, self._fail_queued, closed)

    async def aclose(self) -> None:
        """:meth:`reject_new`, then wait for this loop's in-flight batches. Idempotent."""
        self.reject_new()
        loop = asyncio.get_running_loop()
        state = self._states.get(id(loop))
        if state is not None and state.loop() is loop and state.running:
            if state.idle is None:
                state.idle = loop.create_future()
            await asyncio.shield(state.idle)  # a cancelled aclose leaves others waiting
