"""Awaiting many awaitables at once with nothing left running when one fails."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["gather_all"]


async def gather_all(aws: Iterable[Awaitable[T]]) -> list[T]:
    """Await all of ``aws`` concurrently; their results, in order.

    On any failure or cancellation the rest are cancelled and awaited before this returns,
    so no task outlives the call (a bare ``asyncio.gather`` leaves the others running: a
    ``batch_sample`` whose one prompt failed kept sampling the rest). The first failure is
    raised itself (e.g. ``InvalidContextError``), not the ``ExceptionGroup`` a ``TaskGroup``
    wraps it in, so callers catch it as documented; the group is its ``__context__``.
    """
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_as_coroutine(aw)) for aw in aws]
    except ExceptionGroup as failures:
        raise failures.exceptions[0]  # noqa: B904 - the group stays as __context__
    return [task.result() for task in tasks]


async def _as_coroutine(aw: Awaitable[T]) -> T:
    return await aw
