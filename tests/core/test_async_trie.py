"""AsyncTokenByteTrie: concurrent trie computations are batched and equal direct calls."""

import asyncio

import numpy as np
import pytest

from genlm.core import AsyncTokenByteTrie, TokenByteTrie

VOCAB = [b"a", b"ab", b"abc", b"b", b"ba", b"", b"a"]


def test_concurrent_calls_batch_and_match_direct_calls():
    """Concurrent sums and maxes equal the trie's own methods and share batched calls."""
    trie = TokenByteTrie(VOCAB, eos_token_ids=[5])
    rng = np.random.default_rng(0)
    rows = rng.random((12, len(VOCAB)))
    logrows = np.log(rows)

    async def main():
        async with AsyncTokenByteTrie(trie) as atrie:
            sums = await asyncio.gather(*(atrie.weight_sum(r) for r in rows))
            maxes = await asyncio.gather(*(atrie.weight_max(r) for r in rows))
            logsums = await asyncio.gather(*(atrie.log_weight_sum(r) for r in logrows))
            logmaxes = await asyncio.gather(*(atrie.log_weight_max(r) for r in logrows))
            return sums, maxes, logsums, logmaxes, atrie.batcher.stats

    sums, maxes, logsums, logmaxes, stats = asyncio.run(main())
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(sums[i], trie.weight_sum(row))
        np.testing.assert_array_equal(maxes[i], trie.weight_max(row))
        np.testing.assert_allclose(logsums[i], trie.log_weight_sum(logrows[i]))
        np.testing.assert_array_equal(logmaxes[i], trie.log_weight_max(logrows[i]))
    assert stats["items"] == 48 and stats["batches"] == 4


def test_wrong_row_length_is_rejected():
    """A weight row of the wrong length raises a ValueError naming the expected size."""
    trie = TokenByteTrie(VOCAB)

    async def main():
        async with AsyncTokenByteTrie(trie) as atrie:
            await atrie.weight_sum(np.ones(3))

    with pytest.raises(ValueError, match="7 weights"):
        asyncio.run(main())
