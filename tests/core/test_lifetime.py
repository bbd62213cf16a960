"""A model (or async trie) dropped without close() stops its worker thread (issue #21), and is
freed by reference counting alone: no reference cycle runs through it (memory review 19)."""

import asyncio
import gc
import threading
import weakref

import numpy as np
import pytest

from genlm.core import AsyncTokenByteTrie, ModelClosedError, TokenByteTrie
from genlm.core.mock import MockLM

VOCAB = [b"a", b"b", b"c", b"d"]


def assert_collected_and_stopped(ref: weakref.ref, thread) -> None:
    """The model is gone (nothing, its worker included, kept it) and its thread has left.

    A model used on an event loop may take a second collection: the first one finalizes
    the loop's futures, which held the last references to its requests.
    """
    for _ in range(3):
        gc.collect()
    assert_freed_and_stopped(ref, thread)


def assert_freed_and_stopped(ref: weakref.ref, thread) -> None:
    """The object is gone and its worker thread has left."""
    assert ref() is None
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_a_model_dropped_after_sync_calls_stops_its_worker():
    """Garbage-collecting an unclosed model stops its worker thread."""
    lm = MockLM(VOCAB)
    lm.next_token_logprobs_sync([0])
    thread = lm.worker._thread
    assert thread.is_alive()
    ref = weakref.ref(lm)
    del lm
    assert_collected_and_stopped(ref, thread)


def test_a_model_dropped_after_its_event_loop_ended_stops_its_worker():
    """The same after batched async calls on an event loop that has since closed."""

    async def use() -> tuple[weakref.ref, object]:
        lm = MockLM(VOCAB)
        await asyncio.gather(*(lm.next_token_logprobs([i, 1]) for i in range(4)))
        return weakref.ref(lm), lm.worker._thread

    ref, thread = asyncio.run(use())
    assert_collected_and_stopped(ref, thread)


def test_dropping_a_closed_model_is_harmless():
    """The finalizer of a model closed explicitly finds its worker closed and does nothing."""
    lm = MockLM(VOCAB)
    lm.next_token_logprobs_sync([0])
    thread = lm.worker._thread
    lm.close()
    ref = weakref.ref(lm)
    del lm
    assert_collected_and_stopped(ref, thread)


def test_an_async_trie_dropped_without_aclose_stops_its_worker():
    """The same for AsyncTokenByteTrie (a ByteLM dropped without closing leaves one)."""

    async def use() -> tuple[weakref.ref, object]:
        trie = AsyncTokenByteTrie(TokenByteTrie(VOCAB))
        await trie.weight_sum(np.ones(len(VOCAB)))
        return weakref.ref(trie), trie.worker._thread

    ref, thread = asyncio.run(use())
    assert_collected_and_stopped(ref, thread)


@pytest.fixture
def no_cyclic_gc():
    """The cyclic garbage collector off: only reference counting frees objects."""
    gc.disable()
    yield
    gc.enable()


def test_a_dropped_model_is_freed_by_reference_counting(no_cyclic_gc):
    """A model used sync and async, dropped without close(), is freed at ``del``: nothing
    (its batcher included) makes a reference cycle through it, which would keep its
    weights, KV and output cache until a full collection."""
    lm = MockLM(VOCAB)
    lm.next_token_logprobs_sync([0])

    async def use(lm: MockLM) -> None:
        await asyncio.gather(*(lm.next_token_logprobs([i, 1]) for i in range(4)))
        await lm.sample([0], max_tokens=2, seed=0)

    asyncio.run(use(lm))
    ref, thread = weakref.ref(lm), lm.worker._thread
    del lm
    assert_freed_and_stopped(ref, thread)


def test_a_dropped_async_trie_is_freed_by_reference_counting(no_cyclic_gc):
    """The same for AsyncTokenByteTrie."""
    trie = AsyncTokenByteTrie(TokenByteTrie(VOCAB))
    asyncio.run(trie.weight_sum(np.ones(len(VOCAB))))
    ref, thread = weakref.ref(trie), trie.worker._thread
    del trie
    assert_freed_and_stopped(ref, thread)


def test_requests_of_a_model_dropped_while_they_wait_fail_cleanly(no_cyclic_gc):
    """Batches handed to the worker of a model that is then freed (only the futures of its
    requests are held) fail with ModelClosedError, and its worker stops."""

    async def scenario() -> None:
        lm = MockLM(VOCAB, max_batch_size=1)
        gate = threading.Event()
        lm.worker.submit(gate.wait)  # the batches queue up behind it
        waiters = [lm.batcher.submit(lm.validate_request([i])) for i in range(2)]
        await asyncio.sleep(0)  # the flush hands both batches to the worker
        assert lm.batcher._states[id(asyncio.get_running_loop())].running == 2
        ref, thread = weakref.ref(lm), lm.worker._thread
        del lm
        assert ref() is None
        gate.set()
        for waiter in waiters:
            with pytest.raises(ModelClosedError, match="dropped"):
                await waiter
        await asyncio.to_thread(thread.join, 10)
        assert not thread.is_alive()

    asyncio.run(scenario())
