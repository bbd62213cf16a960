"""Models whose attention depends on the distance between KV columns (a Mistral-style
``sliding_window``, MPT's ALiBi): a batch that mixes a row resuming from cached KV with a
fresh, longer context must not put padding between the first row's past and its new token.
Rows are held to a plain full forward of the same model (fp64; MPT in fp32, as transformers
4.57 cannot build its mask in fp64)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
import transformers
from support import hf_reference as reference

from genlm.backends.hf import HFLM
from genlm.core.backend import resolve_model_path

SMALL = reference.SMALL


def _configs():
    """name -> (config, dtype, atol): fp64 leaves only the float32 rounding of the row;
    fp32 rows of different batch shapes differ by float32 noise (the error this file
    guards against was 0.35 nats or more)."""
    yield "mistral", (transformers.MistralConfig(sliding_window=4, **SMALL), torch.float64, 1e-12)
    yield (
        "phi3",
        (
            transformers.Phi3Config(sliding_window=4, pad_token_id=0, **SMALL),
            torch.float64,
            1e-12,
        ),
    )
    mpt = transformers.MptConfig(
        vocab_size=512, d_model=32, n_heads=4, n_layers=2, max_seq_len=64, expansion_ratio=2
    )
    yield "mpt", (mpt, torch.float32, 2e-5)


CONFIGS = dict(_configs())


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(resolve_model_path("stories260K"))


def random_model(name: str) -> torch.nn.Module:
    config, dtype, _ = CONFIGS[name]
    return reference.random_model(config, dtype)


def plain_forward(model, context) -> np.ndarray:
    return reference.plain_forward(model, context, width=512)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_cached_row_batched_with_a_longer_fresh_one_equals_a_plain_forward(name, tokenizer):
    """Row [5, 6, 7, 8] resumes from the KV of [5, 6, 7] in the batch that also computes an
    8-token fresh context: both rows equal a plain forward (the first was off by about 1
    nat when padding separated its past from its new token)."""
    model = random_model(name)
    lm = HFLM(model, tokenizer, cache_bytes=0)
    cached, fresh = [5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16]

    async def main():
        await lm.next_token_logprobs(cached)
        return await asyncio.gather(
            lm.next_token_logprobs(cached + [8]), lm.next_token_logprobs(fresh)
        )

    try:
        rows = asyncio.run(main())
        assert lm.kv_stats["reused_tokens"] == 3  # the first row did resume from its past
    finally:
        lm.close()
    for context, row in zip([cached + [8], fresh], rows):
        atol = CONFIGS[name][2]
        np.testing.assert_allclose(row, plain_forward(model, context), atol=atol, rtol=1.2e-7)


def test_mpt_takes_its_context_limit_from_max_seq_len(tokenizer):
    """MPT states its maximum positions as ``max_seq_len``: a longer context is refused
    alone, before it reaches a batch (it failed the good request batched with it)."""
    from genlm.core import InvalidContextError

    lm = HFLM(random_model("mpt"), tokenizer, cache_bytes=0)

    async def main():
        return await asyncio.gather(
            lm.next_token_logprobs([1, 2, 3]),
            lm.next_token_logprobs([1] * 65),
            return_exceptions=True,
        )

    try:
        assert lm.max_context_length == 64
        good, long = asyncio.run(main())
    finally:
        lm.close()
    assert isinstance(good, np.ndarray) and isinstance(long, InvalidContextError)


def test_max_forward_tokens_bounds_every_pass_of_equal_new_token_rows(tokenizer):
    """Sixteen rows adding three tokens each, max_forward_tokens=4: every forward pass runs
    at most 4 new tokens (such models batch only equal new-token counts, and a group of 16
    rows ran 16 tokens a pass), and every row equals a plain forward."""
    model = random_model("mistral")
    shapes = []
    forward = model.forward

    def recording(input_ids=None, **kwargs):
        shapes.append(tuple(input_ids.shape))
        return forward(input_ids=input_ids, **kwargs)

    model.forward = recording
    lm = HFLM(model, tokenizer, max_forward_tokens=4, cache_bytes=0)
    contexts = [[1 + i, 20 + i, 40 + i] for i in range(16)]
    try:
        rows = lm.batch_next_token_logprobs_sync(contexts)
    finally:
        lm.close()
    assert shapes and all(b * n <= 4 for b, n in shapes), shapes
    for context, row in zip(contexts, rows):
        np.testing.assert_allclose(row, plain_forward(model, context), atol=1e-12)
