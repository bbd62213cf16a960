"""A model (or async trie) dropped without close() stops its worker thread (issue #21)."""

import asyncio
import gc
import weakref

import numpy as np

from genlm.core import AsyncTokenByteTrie, TokenByteTrie
from genlm.core.mock import MockLM

VOCAB = [b"a", b"b", b"c", b"d"]


def assert_collected_and_stopped(ref: weakref.ref, thread) -> None:
    """The model is gone (nothing, its worker included, kept it) and its thread has left.

    A model used on an event loop may take a second collection: the first one finalizes
    the loop's futures, which held the last references to its requests.
    """
    for _ in range(3):
        gc.collect()
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
