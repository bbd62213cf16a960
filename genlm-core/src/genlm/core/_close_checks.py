"""The machinery of the conformance kit's close checks (:mod:`genlm.core.testing`): the
requests a check makes before it closes a model, judged afterwards by what each ended
with, and the thread on which each step of a check runs, so that a step that hangs fails
its check instead of hanging the test run.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Generic, TypeVar

import attrs
import numpy as np
import pytest

from genlm.core._errors import ModelClosedError
from genlm.core._protocol import AsyncLM

__all__ = [
    "InFlight",
    "InThread",
    "aclose_call",
    "assert_resolved",
    "describe_outcome",
    "has_close",
    "make_requests",
    "outcome_of",
    "rows_problem",
    "settle",
    "sync_on_a_thread",
    "tokens_problem",
]

T = TypeVar("T")


@attrs.frozen
class InFlight:
    """A request a close check makes before it closes the model (in flight at the close),
    and what it may end with besides ModelClosedError."""

    #: Names it in a failure: the call and its arguments.
    name: str
    #: When it is made: 0 first, 1 right before the close (see :func:`make_requests`).
    wave: int
    #: Makes it: a coroutine, awaited on the check's event loop.
    make: Callable[[], Awaitable[object]]
    #: What is wrong with a result it returned, or None where it is right.
    problem: Callable[[object], str | None]


class InThread(Generic[T]):
    """``call()`` on a daemon thread of its own, started at once: how a close check bounds
    a step that may hang (the thread is left behind if it does)."""

    def __init__(self, call: Callable[[], T]):
        self._outcome: list[tuple[T | None, BaseException | None]] = []
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.name = f"genlm-kit-{self._thread.name}"
        self._thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self._outcome.append((call(), None))
        except BaseException as exc:  # noqa: BLE001 - raised again on the check's thread
            self._outcome.append((None, exc))

    def wait(self, timeout: float) -> None:
        """Wait at most ``timeout`` seconds for the call to end, whatever its outcome."""
        self._thread.join(timeout)

    def result(self, timeout: float, what: str, stage: list[str] | None = None) -> T:
        """The call's result, or its exception raised here; fails the check, naming
        ``what`` (and the last of ``stage``), where it has not ended after ``timeout``
        seconds."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            at = f" (it was at: {stage[-1]})" if stage else ""
            pytest.fail(f"{what} did not finish within {timeout:g} s{at}")
        value, exc = self._outcome[0]
        if exc is not None:
            raise exc
        return value


def has_close(lm: AsyncLM) -> bool:
    """Whether ``lm`` has a sync ``close()`` (``BatchedLM`` has; the protocol has ``aclose``)."""
    return callable(getattr(lm, "close", None))


def aclose_call(lm: AsyncLM) -> Callable[[], None]:
    """``lm.aclose()`` on an event loop of its own, as a call."""
    return lambda: asyncio.run(lm.aclose())


def outcome_of(call: Callable[[], object]) -> object:
    """What ``call()`` returned, or the exception it raised."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - judged by the check
        return exc


def describe_outcome(outcome: object) -> str:
    """A result or exception, short enough for a failure message."""
    if isinstance(outcome, np.ndarray):
        return f"an array of shape {outcome.shape}"
    return repr(outcome)


def sync_on_a_thread(method: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """A sync twin as a coroutine function: each call runs on a daemon thread of its own,
    awaited on the loop (a thread of the loop's executor would hold ``asyncio.run`` at
    its end where the call hung, and the check could not say which request hung)."""

    async def call(*args: object) -> T:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def resolve(result: object, exc: BaseException | None) -> None:
            if done.done():
                return
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(result)

        def run() -> None:
            outcome = outcome_of(partial(method, *args))
            exc = outcome if isinstance(outcome, Exception) else None
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                loop.call_soon_threadsafe(resolve, outcome, exc)

        threading.Thread(target=run, name="genlm-kit-sync-call", daemon=True).start()
        return await done

    return call


async def make_requests(requests: list[InFlight]) -> dict[str, asyncio.Future]:
    """Makes ``requests`` on the running loop, each a task: wave 0, then two steps of the
    loop (their batch reaches the backend), then wave 1, then one step (made and queued,
    not yet fired where the model batches what is made together)."""
    tasks: dict[str, asyncio.Future] = {}
    for wave, steps in ((0, 2), (1, 1)):
        tasks.update({r.name: asyncio.ensure_future(r.make()) for r in requests if r.wave == wave})
        for _ in range(steps):
            await asyncio.sleep(0)
    return tasks


async def settle(
    tasks: dict[str, asyncio.Future], timeout: float
) -> tuple[dict[str, object], list[str]]:
    """Each task's outcome once it has ended (its result, or its exception), by name,
    and the names of those still pending ``timeout`` seconds on (then cancelled)."""
    if tasks:
        await asyncio.wait(tasks.values(), timeout=timeout)
    outcomes: dict[str, object] = {}
    for name, task in tasks.items():
        if task.cancelled():
            outcomes[name] = asyncio.CancelledError()
        elif task.done():
            outcomes[name] = task.exception() or task.result()
    pending = [name for name, task in tasks.items() if not task.done()]
    for name in pending:
        tasks[name].cancel()
    return outcomes, pending


def assert_resolved(
    requests: list[InFlight], outcomes: dict[str, object], pending: list[str], waited: float
) -> None:
    """Fails a close check where a request made before the close was left pending, or
    ended otherwise than with its result or ModelClosedError."""
    assert not pending, (
        f"{len(pending)} of {len(requests)} requests made before the close were still "
        f"pending {waited:g} s after it: {'; '.join(pending)}"
    )
    problems = []
    for request in requests:
        outcome = outcomes[request.name]
        if isinstance(outcome, ModelClosedError):
            continue
        if isinstance(outcome, BaseException):
            problems.append(
                f"{request.name} raised {outcome!r}, neither its result nor ModelClosedError"
            )
        elif (problem := request.problem(outcome)) is not None:
            problems.append(f"{request.name} {problem}")
    assert not problems, "requests in flight at the close: " + "; ".join(problems)


def rows_problem(expected: np.ndarray, atol: float, outcome: object) -> str | None:
    """What is wrong with ``outcome``, a row (``expected`` 1-D) or a batch (2-D): not
    an array of that shape, or unlike ``expected`` beyond ``atol``; None where right."""
    if not isinstance(outcome, np.ndarray) or outcome.shape != expected.shape:
        return f"gave {describe_outcome(outcome)}, not rows of shape {expected.shape}"
    wrong = ~np.isclose(outcome, expected, rtol=1e-7, atol=atol)
    if wrong.any():
        return (
            f"gave rows unlike those computed before the close in {int(wrong.sum())} of "
            f"{wrong.size} entries (atol {atol:g})"
        )
    return None


def tokens_problem(
    expected: list[int] | None, count: int, vocab_size: int, outcome: object
) -> str | None:
    """What is wrong with ``outcome``, a sample of ``count`` tokens without EOS: not the
    ``expected`` tokens (a seeded sample), or not ``count`` ids of the vocabulary;
    None where right."""
    if expected is not None:
        if isinstance(outcome, list) and outcome == expected:
            return None
        return (
            f"drew {describe_outcome(outcome)}, not {expected}, what its seed drew before the close"
        )
    if not isinstance(outcome, list) or len(outcome) != count:
        return f"gave {describe_outcome(outcome)}, not {count} tokens"
    if not all(isinstance(t, (int, np.integer)) and 0 <= t < vocab_size for t in outcome):
        return f"gave {outcome}, not ids of the vocabulary"
    return None
