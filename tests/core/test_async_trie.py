"""AsyncTokenByteTrie: concurrent trie computations are batched and equal direct calls."""

import array
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


@pytest.mark.parametrize(
    "dtype", ["float64", "float32", "torch.float64", "torch.float32", "array.array"]
)
def test_a_buffer_refilled_between_calls_gives_each_call_its_own_row(dtype):
    """Concurrent calls given one buffer, refilled after each call is made (the batch runs
    later), each answer the row their call was given, as the trie's direct calls do: a
    float64 row (numpy or torch) was kept by reference, not read as float64 into a copy,
    and all three calls answered the last fill."""
    trie = TokenByteTrie(VOCAB)
    if dtype.startswith("torch"):
        torch = pytest.importorskip("torch")
        buffer = torch.zeros(len(VOCAB), dtype=getattr(torch, dtype.split(".")[1]))
    elif dtype == "array.array":  # a buffer numpy reads without a copy
        buffer = array.array("d", [0.0] * len(VOCAB))
    else:
        buffer = np.zeros(len(VOCAB), dtype=dtype)

    async def main():
        async with AsyncTokenByteTrie(trie) as atrie:
            calls = []
            for i in range(3):
                for j in range(len(VOCAB)):
                    buffer[j] = float(j == i)
                calls.append(asyncio.ensure_future(atrie.weight_sum(buffer)))
                await asyncio.sleep(0)  # the call is made: its row queued for a batch
            return await asyncio.gather(*calls)

    for i, got in enumerate(asyncio.run(main())):
        own = np.zeros(len(VOCAB))
        own[i] = 1
        np.testing.assert_array_equal(np.asarray(got), trie.weight_sum(own))


def test_wrong_row_length_is_rejected():
    """A weight row of the wrong length raises a ValueError naming the expected size."""
    trie = TokenByteTrie(VOCAB)

    async def main():
        async with AsyncTokenByteTrie(trie) as atrie:
            await atrie.weight_sum(np.ones(3))

    with pytest.raises(ValueError, match="7 weights"):
        asyncio.run(main())


def brute_log_sums(trie: TokenByteTrie, vocab: list[bytes], lp: np.ndarray) -> np.ndarray:
    """Brute force: log of the total probability of the tokens starting with each node's prefix."""
    out = np.full(trie.num_nodes, -np.inf)
    for v in range(trie.num_nodes):
        ids = [i for i, b in enumerate(vocab) if b and b.startswith(trie.prefix(v))]
        if ids:
            out[v] = np.log(np.exp(lp[ids]).sum())
    return out


@pytest.mark.parametrize(
    "bad",
    [
        np.array(["x"] * 7),
        [object()] * 7,
        np.array(["-0.5"] * 7),
        np.array([b"-1"] * 7),
        np.array(["-0.5"] * 7, dtype=object),
    ],
    ids=["str", "objects", "numeric-str", "numeric-bytes", "numeric-str-objects"],
    # numpy parsed the numeric ones
)
def test_a_row_that_is_not_numbers_fails_alone(bad):
    """A row of the right shape that is not numbers fails its own call, before it is batched;
    the calls made with it get their results (they failed with it when it was stacked)."""
    trie = TokenByteTrie(VOCAB)
    lp = np.log(np.random.default_rng(2).random((2, len(VOCAB))))

    async def main():
        async with AsyncTokenByteTrie(trie) as atrie:
            out = await asyncio.gather(
                atrie.log_weight_sum(lp[0]),
                atrie.log_weight_sum(bad),
                atrie.log_weight_sum(lp[1]),
                return_exceptions=True,
            )
            return out, atrie.batcher.stats

    (first, error, last), stats = asyncio.run(main())
    for got, row in ((first, lp[0]), (last, lp[1])):
        assert isinstance(got, np.ndarray), got
        np.testing.assert_allclose(got, brute_log_sums(trie, VOCAB, row), rtol=1e-13)
    assert isinstance(error, (TypeError, ValueError))
    assert "weights must be an array of numbers" in str(error)
    assert stats["items"] == 2 and stats["batches"] == 1


@pytest.mark.parametrize("not_a_trie", [[b"a", b"b"], None, "ab"])
def test_a_trie_that_is_not_a_token_byte_trie_is_refused_at_construction(not_a_trie):
    """The constructor names what to pass, where every later call failed with an
    AttributeError from inside the batch ('list' object has no attribute 'vocab_size')."""
    with pytest.raises(TypeError, match=r"trie must be a genlm\.core\.TokenByteTrie"):
        AsyncTokenByteTrie(not_a_trie)
