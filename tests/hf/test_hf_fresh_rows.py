"""Batches that mix fresh contexts (no KV to resume from) of different lengths.

Padding left of a fresh row's first token is a query with every column masked. Attention
that takes its softmax in float32 with the float64 mask minimum (Bloom on transformers 4.57
and 5, CodeGen on 4.57, transformers' eager attention of Llama and the models that share
it) made such a query NaN in a float64 model, and the NaN reached every position of the
row: the batch failed. A float64 model without SDPA attention now runs only rows that add
the same number of tokens together (no padded query). Each row is held to that context's
own unbatched forward through plain transformers (no padding there), in float64 and
float32, for those models and for sdpa attention and absolute positions (GPT-2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from support import hf_reference as reference
from support.hf_reference import plain_forward

from genlm.backends.hf import HFLM
from genlm.backends.hf._kv import SEGMENT_OVERHEAD_BYTES
from genlm.core.backend import resolve_model_path

VOCAB = 512


def _configs():
    """name -> (config, dtype, attn_implementation or None for the default, atol).

    The rows are float32 (about 6e-8 relative), and Bloom and CodeGen take every softmax in
    float32, which a batch of another shape may round otherwise; fp32 models differ by
    float32 noise between batch shapes."""
    bloom = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)
    codegen = transformers.CodeGenConfig(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=4
    )
    llama = transformers.LlamaConfig(**reference.SMALL)
    gpt2 = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    yield "bloom-fp64", (bloom, torch.float64, None, 1e-6)
    yield "bloom-fp32", (bloom, torch.float32, None, 1e-5)
    yield "codegen-fp64", (codegen, torch.float64, None, 1e-6)
    yield "llama-eager-fp64", (llama, torch.float64, "eager", 1e-12)
    yield "llama-sdpa-fp32", (llama, torch.float32, "sdpa", 1e-5)
    yield "gpt2-fp64", (gpt2, torch.float64, None, 1e-12)


CONFIGS = dict(_configs())


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(resolve_model_path("stories260K"))


def random_model(name: str) -> torch.nn.Module:
    config, dtype, attention, _ = CONFIGS[name]
    return reference.random_model(config, dtype, attention)


def assert_rows_equal_plain_forwards(name, model, contexts, rows) -> None:
    atol = CONFIGS[name][3]
    for context, row in zip(contexts, rows):
        expected = plain_forward(model, context)
        np.testing.assert_allclose(row, expected, atol=atol, rtol=1.2e-7, err_msg=str(context))


def assert_kv_holds(lm, tokens: int, segments: int) -> None:
    """The KV cache holds the KV of ``tokens`` tokens in ``segments`` segments."""
    expected = tokens * lm.shape.bytes_per_token + segments * SEGMENT_OVERHEAD_BYTES
    assert lm.kv.nbytes == expected


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fresh_contexts_of_different_lengths_share_a_pass_and_equal_plain_forwards(name, tokenizer):
    """Three fresh contexts of 2, 4 and 6 tokens in one batch, then two beside a row
    resuming from its cached past, then each particle extends its context by a token:
    every row equals a plain forward (Bloom in fp64 failed with NaN rows), and the
    continuations resume from the KV the fresh rows stored. The rows share one forward
    pass, but in float64 without SDPA, where each number of new tokens has a pass of its
    own."""
    model = random_model(name)
    alone = CONFIGS[name][1] == torch.float64 and model.config._attn_implementation != "sdpa"
    lm = HFLM(model, tokenizer, cache_bytes=0)
    fresh = [[1, 5], [1, 9, 10, 11], [1, 20, 21, 22, 23, 24]]
    try:
        rows = lm.batch_next_token_logprobs_sync(fresh)
        assert lm.kv_stats["forwards"] == (3 if alone else 1)
        assert_rows_equal_plain_forwards(name, model, fresh, rows)
        assert_kv_holds(lm, tokens=12, segments=3)

        mixed = [[1, 9, 10, 11, 12], [1, 30], [1, 40, 41, 42]]  # the first resumes from 4
        forwards = lm.kv_stats["forwards"]
        rows = lm.batch_next_token_logprobs_sync(mixed)
        assert lm.kv_stats["forwards"] - forwards == (3 if alone else 1)
        assert lm.kv_stats["reused_tokens"] == 4
        assert_rows_equal_plain_forwards(name, model, mixed, rows)

        extended = [c + [50 + i] for i, c in enumerate(fresh + mixed[1:])]
        rows = lm.batch_next_token_logprobs_sync(extended)
        assert lm.kv_stats["computed_tokens"] == 12 + 7 + len(extended)  # one token each
        assert_rows_equal_plain_forwards(name, model, extended, rows)
    finally:
        lm.close()
