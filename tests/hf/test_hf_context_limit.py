"""The hf backend rejects contexts longer than the model's maximum positions, on the caller's
side: stories260K has ``max_position_embeddings=512``."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from genlm.backends.hf import HFLM
from genlm.core import InvalidContextError

MODEL = "stories260K-fp64"


def context(n: int, seed: int) -> list[int]:
    """``n`` random token ids of stories260K's 512-token vocabulary."""
    return [int(t) for t in np.random.default_rng(seed).integers(3, 512, size=n)]


def test_limit_comes_from_the_config(loaded):
    """The limit is the model's max_position_embeddings; None lifts it; no limit, no check."""
    model, tok = loaded(MODEL)
    assert model.config.max_position_embeddings == 512
    lm = HFLM(model, tok, cache_bytes=0)
    assert lm.max_context_length == 512
    lm.close()
    lifted = HFLM(model, tok, cache_bytes=0, max_context_length=None)
    assert lifted.max_context_length is None
    lifted.close()


def test_512_tokens_run_and_513_are_rejected_before_the_model(loaded, check):
    """The longest allowed context gives the full forward's row; one more token raises."""
    model, tok = loaded(MODEL)
    lm = HFLM(model, tok, cache_bytes=0)
    longest = context(512, seed=0)
    check(model, longest, lm.next_token_logprobs_sync(longest))
    forwards = lm.kv_stats["forwards"]
    with pytest.raises(InvalidContextError, match=r"513 tokens.*maximum of 512"):
        lm.next_token_logprobs_sync(longest + [5])
    with pytest.raises(InvalidContextError, match="50000 tokens"):
        lm.next_token_logprobs_sync(context(50_000, seed=1))
    with pytest.raises(InvalidContextError):
        lm.cache_kv(longest + [5])
    assert lm.kv_stats["forwards"] == forwards  # nothing ran
    lm.close()


def test_one_long_request_does_not_fail_its_batch_mates(loaded, check):
    """Concurrent requests: the too-long one raises, the others get their exact rows."""
    model, tok = loaded(MODEL)
    lm = HFLM(model, tok, cache_bytes=0, max_wait_s=0.05)
    contexts = [context(10, seed=2), context(513, seed=3), context(512, seed=4), [1]]

    async def together():
        return await asyncio.gather(
            *(lm.next_token_logprobs(c) for c in contexts), return_exceptions=True
        )

    results = asyncio.run(together())
    assert isinstance(results[1], InvalidContextError)
    for i in (0, 2, 3):
        check(model, contexts[i], results[i])
    assert lm.kv_stats["forwards"] >= 1
    lm.close()
