"""``max_context_length``: a context longer than the model's limit is rejected on the
caller's side, before it enters a batch, so it never fails the requests batched with it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from genlm.core import InvalidContextError
from genlm.core.mock import MockLM, mock_logprobs

VOCAB = [bytes([i]) for i in range(16)]


def test_limit_is_inclusive_and_the_message_names_both_lengths():
    """A context of exactly the limit runs; one token more raises, naming limit and length."""
    lm = MockLM(VOCAB, max_context_length=8)
    np.testing.assert_allclose(
        lm.next_token_logprobs_sync([1] * 8), mock_logprobs([1] * 8, 16), atol=1e-6
    )
    with pytest.raises(InvalidContextError, match=r"9 tokens.*maximum of 8"):
        lm.next_token_logprobs_sync([1] * 9)
    assert all(len(c) <= 8 for batch in lm.batches for c in batch)
    lm.close()


def test_too_long_request_fails_alone_and_never_reaches_the_backend():
    """Concurrent requests: the long one raises, its would-be batch-mates get their rows."""
    lm = MockLM(VOCAB, max_context_length=4, max_wait_s=0.05)
    contexts = [[1], [2, 3], [1, 2, 3, 4, 5], [4, 4, 4, 4]]

    async def together():
        return await asyncio.gather(
            *(lm.next_token_logprobs(c) for c in contexts), return_exceptions=True
        )

    results = asyncio.run(together())
    assert isinstance(results[2], InvalidContextError)
    for i in (0, 1, 3):
        np.testing.assert_allclose(results[i], mock_logprobs(contexts[i], 16), atol=1e-6)
    assert sorted(c for batch in lm.batches for c in batch) == [(1,), (2, 3), (4, 4, 4, 4)]
    with pytest.raises(InvalidContextError):  # validated before any is queued
        lm.batch_next_token_logprobs_sync([[1], [1] * 5])
    lm.close()


def test_no_limit_by_default_and_a_bad_limit_is_refused():
    """None (the default) accepts any length; a limit below 1 is a configuration error."""
    lm = MockLM(VOCAB)
    assert lm.max_context_length is None
    assert lm.next_token_logprobs_sync([3] * 1000).shape == (16,)
    lm.close()
    with pytest.raises(ValueError, match="max_context_length"):
        MockLM(VOCAB, max_context_length=0)


def test_sampling_stops_at_the_limit_and_returns_what_it_drew():
    """Sampling that reaches max_context_length returns its tokens instead of raising
    (it used to raise InvalidContextError, losing them): the last token is drawn from a
    context of exactly the limit, and each token is the one an unlimited model draws with
    the same seed (the limit only truncates). A prompt over the limit still raises."""
    limited = MockLM(VOCAB, max_context_length=6)
    free = MockLM(VOCAB)
    prompt = [1, 2, 3]

    async def both():
        return (
            await limited.sample(prompt, 20, eos_token_ids=[], seed=7),
            await free.sample(prompt, 20, eos_token_ids=[], seed=7),
            await limited.batch_sample([prompt, [5] * 6], 20, eos_token_ids=[], seed=3),
            await free.batch_sample([prompt, [5] * 6], 20, eos_token_ids=[], seed=3),
        )

    capped, full, capped_batch, full_batch = asyncio.run(both())
    assert len(full) == 20 and capped == full[: 6 + 1 - len(prompt)]
    assert [len(t) for t in capped_batch] == [4, 1]
    assert capped_batch == [full_batch[0][:4], full_batch[1][:1]]
    assert max(len(c) for batch in limited.batches for c in batch) == 6
    with pytest.raises(InvalidContextError, match="maximum of 6"):
        asyncio.run(limited.sample([1] * 7, 3))
    limited.close()
    free.close()
