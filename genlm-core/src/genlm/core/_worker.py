"""One dedicated thread per model, so that blocking forward passes leave the event loop free.

Thread-affine engines (MLX streams, vLLM's engine, CUDA contexts) must always see the
same thread, so every call into a backend — loading, forward passes, KV management,
adapter changes — goes through the model's single :class:`ModelWorker`.

Following anyio's worker design, the worker never touches an asyncio future: it runs
the function and posts the outcome back with ``loop.call_soon_threadsafe``; the future
is resolved on the loop thread, and only if it is still pending and the loop is open.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from genlm.core._errors import ModelClosedError

logger = logging.getLogger(__name__)

T = TypeVar("T")

_STOP = object()


class ModelWorker:
    """A single named daemon thread that runs submitted calls in order.

    The thread starts on first use and stops on :meth:`close`; calls submitted after
    ``close`` raise :class:`ModelClosedError`.
    """

    def __init__(self, name: str = "genlm-model"):
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def on_worker_thread(self) -> bool:
        """Whether the caller is running on this worker's thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def _ensure_started(self) -> None:
        with self._lock:
            if self._closed:
                raise ModelClosedError(f"{self.name} is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            ctx, fn, args, deliver = item
            try:
                result = ctx.run(fn, *args)
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
                deliver(None, exc)
            else:
                deliver(result, None)

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """Queue ``fn(*args)``; return a thread-safe future of its result."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def deliver(result: Any, exc: BaseException | None) -> None:
            if exc is None:
                future.set_result(result)
            else:
                future.set_exception(exc)

        self._put(fn, args, deliver)
        return future

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the worker and block until it finishes.

        Called from the worker thread itself (a backend calling back into the model),
        it runs inline instead of deadlocking.
        """
        if self.on_worker_thread():
            return fn(*args)
        return self.submit(fn, *args).result()

    def run_async(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``fn(*args)`` and return an asyncio future resolved on the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def resolve(result: Any, exc: BaseException | None) -> None:
            if future.done():  # cancelled by its waiter meanwhile
                return
            if exc is None:
                future.set_result(result)
            else:
                future.set_exception(exc)

        def deliver(result: Any, exc: BaseException | None) -> None:
            try:
                loop.call_soon_threadsafe(resolve, result, exc)
            except RuntimeError:  # the loop closed while we worked: nobody is waiting
                logger.debug("%s: result dropped, event loop closed", self.name)

        self._put(fn, args, deliver)
        return future

    def _put(self, fn: Callable[..., Any], args: tuple, deliver: Callable) -> None:
        self._ensure_started()
        self._queue.put((contextvars.copy_context(), fn, args, deliver))

    def close(self, wait: bool = True) -> None:
        """Finish the queued calls, then stop the thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(_STOP)
            if wait and threading.current_thread() is not thread:
                thread.join()
