"""MockLM's record of batches stays bounded over a long run (issue #21)."""

import pytest

from genlm.core.mock import MockLM

VOCAB = [b"a", b"b", b"c", b"d", b"e"]


def test_batches_keeps_the_latest_and_the_counters_count_everything():
    """With keep_batches=2, batches holds the last two batches; the counters hold all five."""
    lm = MockLM(VOCAB, keep_batches=2)
    contexts = [[[i, 0], [i, 1]] for i in range(5)]
    for batch in contexts:
        lm.batch_next_token_logprobs_sync(batch)
    lm.close()
    assert lm.batches == [[tuple(c) for c in batch] for batch in contexts[-2:]]
    assert lm.batch_count == 5 and lm.context_count == 10


def test_the_default_record_is_bounded():
    """A run of more batches than KEEP_BATCHES keeps only the latest KEEP_BATCHES."""
    lm = MockLM([bytes([b]) for b in range(256)])
    n = MockLM.KEEP_BATCHES + 5
    contexts = [(i // 256, i % 256) for i in range(n)]  # all distinct: no cache hit
    for context in contexts:
        lm.next_token_logprobs_sync(context)
    lm.close()
    assert lm.batch_count == n
    assert lm.batches == [[c] for c in contexts[-MockLM.KEEP_BATCHES :]]


def test_keep_batches_zero_records_none():
    """keep_batches=0 records nothing but still counts; a negative bound is refused."""
    lm = MockLM(VOCAB, keep_batches=0)
    lm.next_token_logprobs_sync([0])
    lm.close()
    assert lm.batches == [] and lm.batch_count == 1
    with pytest.raises(ValueError, match="keep_batches"):
        MockLM(VOCAB, keep_batches=-1)
