"""Rows are views of their batch: no copy per row, one block of memory per batch.

A backend's batch becomes the rows callers get and the cache holds (``BatchRows``), copied
once first unless the backend declares ``stable_batches``. The output cache counts a batch
once while any of its rows is held, turns rows reused after the rest of their batch was
evicted into copies of their own, and stores copies when a batch is too large to share.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from genlm.core.backend import BatchRows, OutputCache, Request, compact_row, key_nbytes
from genlm.core.mock import MockLM, mock_logprobs

VOCAB = [bytes([b]) for b in range(16)]
CONTEXTS = [[1], [1, 2], [3, 4, 5], [6]]


def expected(context: list[int]) -> np.ndarray:
    return mock_logprobs(context, len(VOCAB)).astype(np.float32)


def test_rows_are_read_only_views_of_one_batch_counted_once():
    lm = MockLM(VOCAB)
    try:

        async def step():
            return await asyncio.gather(*(lm.next_token_logprobs(c) for c in CONTEXTS))

        rows = asyncio.run(step())
        assert len(lm.batches) == 1
        batch = rows[0].base
        assert batch is not None and batch.shape == (len(CONTEXTS), len(VOCAB))
        for context, row in zip(CONTEXTS, rows):
            assert row.base is batch and not row.flags.writeable
            np.testing.assert_array_equal(row, expected(context))
        keys = sum(key_nbytes(Request(None, tuple(c))) for c in CONTEXTS)
        assert lm.output_cache.nbytes == batch.nbytes + keys
    finally:
        lm.close()


class ReusingMock(MockLM):
    """Writes every batch into the same buffer, as a backend with a static output buffer
    (CUDA graphs) does; it does not declare ``stable_batches``."""

    stable_batches = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.buffer = np.empty((8, len(VOCAB)), dtype=np.float32)

    def _logprobs_batch(self, contexts, variant):
        out = self.buffer[: len(contexts)]
        out[:] = super()._logprobs_batch(contexts, variant)
        return out


def test_a_backend_that_reuses_its_buffer_gets_its_batch_copied_once():
    lm = ReusingMock(VOCAB)
    try:
        first = lm.batch_next_token_logprobs_sync(CONTEXTS[:2])
        cached = [lm.next_token_logprobs_sync(c) for c in CONTEXTS[:2]]
        lm.batch_next_token_logprobs_sync(CONTEXTS[2:])  # overwrites the backend's buffer
        for context, row, again in zip(CONTEXTS, first, cached):
            np.testing.assert_array_equal(row, expected(context))
            np.testing.assert_array_equal(again, expected(context))
            assert again.base is not lm.buffer and again.base.base is None
        assert len(lm.batches) == 2
    finally:
        lm.close()


def batch_rows(n: int, width: int, first: float) -> BatchRows:
    """``n`` rows of ``width`` float32s viewing one read-only batch; row i starts with
    ``first + i``."""
    out = np.zeros((n, width), dtype=np.float32)
    out[:, 0] = np.arange(first, first + n)
    out.setflags(write=False)
    return BatchRows(out, out)


def test_a_reused_row_outlives_the_rest_of_its_batch_as_a_copy():
    """A's rows run first in LRU order, then C's, then A's reused row: once A's run is
    evicted the reused row becomes a copy, and only its own bytes are counted."""
    keys = {name: [(name, i) for i in range(4)] for name in "ABC"}
    size = {name: sum(key_nbytes(k) for k in keys[name]) for name in "ABC"}
    block = 4 * 100 * 4
    cache = OutputCache(max_bytes=2 * block + size["A"] + size["C"] + 100)
    cache.put_many(keys["A"], batch_rows(4, 100, 0))
    cache.put_many(keys["C"], batch_rows(4, 100, 10))
    reused = cache.get(("A", 2))
    assert reused.base is not None  # still a view of A's batch
    assert cache.nbytes == 2 * block + size["A"] + size["C"]
    cache.put_many(keys["B"], batch_rows(4, 100, 20))  # evicts A's run, then C's
    held = dict(cache.items())
    assert set(held) == {("A", 2), *keys["B"]}
    kept = held[("A", 2)]
    assert kept.base is None and kept[0] == 2 and not kept.flags.writeable
    np.testing.assert_array_equal(kept, reused)
    assert cache.nbytes == block + size["B"] + 100 * 4 + key_nbytes(("A", 2))


def test_rows_used_in_order_are_evicted_with_their_batch_without_a_copy(monkeypatch):
    """SMC's pattern: no row is read again, so whole batches go and nothing is copied."""
    copies = []
    cache = OutputCache(max_bytes=3 * (16 * 64 * 4 + 16 * key_nbytes((0, 0))))
    monkeypatch.setattr(cache, "_detach", lambda row: copies.append(row) or row.copy())
    for step in range(10):
        cache.put_many([(step, i) for i in range(16)], batch_rows(16, 64, step * 16))
    assert not copies and len(cache) == 3 * 16
    assert {row.base.ctypes.data for _, row in cache.items()} == {
        cache.get((step, 0)).base.ctypes.data for step in (7, 8, 9)
    }


@pytest.mark.parametrize("budget", [0, 1000, 4 * 100 * 4 * 2 - 1])
def test_a_batch_of_more_than_half_the_budget_is_stored_as_copies(budget):
    rows = batch_rows(4, 100, 0)
    keys = [("k", i) for i in range(4)]
    cache = OutputCache(max_bytes=budget)
    cache.put_many(keys, rows)
    held = cache.items()
    fits = budget // (400 + key_nbytes(keys[0]))
    assert len(held) == min(fits, 4)
    for key, row in held:
        assert row.base is None and row[0] == key[1]
    assert cache.nbytes == sum(400 + key_nbytes(k) for k, _ in held)


def test_compact_row_copies_only_a_view():
    """What a cache kept apart from core's stores for a row: the row itself when it owns
    exactly its memory, else a read-only copy that does."""
    rows = batch_rows(3, 8, 0)
    kept = compact_row(rows[1])
    assert kept is not rows[1] and kept.base is None and not kept.flags.writeable
    np.testing.assert_array_equal(kept, rows[1])
    assert compact_row(kept) is kept


def test_compact_row_copies_a_view_where_the_c_kernel_has_no_block_type(monkeypatch):
    """A C trie kernel built before it exposed its ``Block`` type (an editable install not
    rebuilt) gives rows whose base compact_row cannot inspect: it copies them, where
    reading the missing attribute failed every mass genlm-bytes computed."""
    import sys
    import types

    monkeypatch.setitem(sys.modules, "genlm.core._trie_kernel", types.ModuleType("old"))
    rows = batch_rows(3, 8, 0)
    kept = compact_row(rows[1])
    assert kept.base is None and not kept.flags.writeable
    np.testing.assert_array_equal(kept, rows[1])


def test_compact_row_of_a_torch_view_is_a_clone_of_its_own():
    torch = pytest.importorskip("torch")
    batch = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    row = batch.unbind(0)[1]
    kept = compact_row(row)
    assert kept.untyped_storage().nbytes() == 16 and torch.equal(kept, row)
    assert compact_row(kept) is kept
