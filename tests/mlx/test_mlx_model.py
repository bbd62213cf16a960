"""What MLXLM takes from the model it wraps, what it refuses, and what it lets go of when
closed."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from support.mlx_reference import plain_logprobs

from genlm.backends.mlx import MLXLM


@pytest.fixture(scope="module")
def tokenizer(stories_dir):
    """stories260K's tokenizer (512 tokens)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(stories_dir)


def test_wrapped_language_model_arguments_come_from_text_config(tokenizer):
    """A model keeping its language model's arguments in ``args.text_config`` (qwen2_vl,
    its vocabulary padded to 576 past the tokenizer's 512, as Qwen2-VL's 152064 past
    151657) gets a 576-wide vocabulary and the 64-position limit, and its plain forward's
    rows (both were read from ``args``, which names neither: every request failed on the
    row width, and no limit was set)."""
    from mlx_lm.models import qwen2_vl

    text = dict(
        model_type="qwen2",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=576,
        max_position_embeddings=64,
    )
    mx.random.seed(0)
    args = qwen2_vl.ModelArgs.from_dict({"model_type": "qwen2_vl", "text_config": text})
    model = qwen2_vl.Model(args)
    lm = MLXLM(model, tokenizer, cache_bytes=0)
    try:
        assert len(lm.vocab) == 576 and lm.max_context_length == 64
        contexts = [[1, 403, 407], [1, 403, 407, 261]]
        for context, row in zip(contexts, lm.batch_next_token_logprobs_sync(contexts)):
            np.testing.assert_allclose(row, plain_logprobs(model, context), atol=1e-5)
    finally:
        lm.close()


def test_aclose_releases_the_model(stories_dir):
    """After ``aclose()`` (the end of ``async with``) the model's weights are freed although
    the closed object is still referenced (it kept ``model``: MLX held the weights until
    the object went)."""
    import mlx_lm

    model, tokenizer = mlx_lm.load(stories_dir)
    weights = weakref.ref(model)

    async def use_and_close(lm: MLXLM) -> None:
        async with lm:
            await lm.next_token_logprobs([1, 403, 407])

    lm = MLXLM(model, tokenizer, cache_bytes=0)
    del model
    asyncio.run(use_and_close(lm))
    gc.collect()
    assert weights() is None and lm.model is None


class NoCacheModel(nn.Module):
    """An mlx-lm-like model whose cache cannot be made (what MLXLM inspects to resume)."""

    def make_cache(self):
        raise RuntimeError("no cache for this model")


@pytest.mark.parametrize(
    ("model", "error", "match"),
    [
        ("stories260K", TypeError, r"cannot wrap str .*MLXLM\.from_name\('stories260K'\)"),
        (nn.Linear(4, 4), TypeError, r"cannot wrap Linear .*mlx_lm\.load\(path\)\[0\]"),
        (NoCacheModel(), RuntimeError, "no cache for this model"),
    ],
    ids=["name", "module", "failing-cache"],
)
def test_a_model_refused_leaves_no_thread(tokenizer, model, error, match):
    """A name, a module that is no mlx-lm model (a TypeError pointing to from_name, not a
    bare AttributeError), and a model whose caches fail all raise before the worker thread
    starts (it started first, and a thread that ran MLX stays parked for good)."""
    before = set(threading.enumerate())
    with pytest.raises(error, match=match):
        MLXLM(model, tokenizer)
    assert set(threading.enumerate()) <= before


def test_sampling_ends_at_the_models_own_eos_ids(tiny_mild_dir, tmp_path):
    """The EOS ids mlx-lm reads from the model's configuration (what its generation stops
    on) join the tokenizer's: greedy sampling ends at the token the model picks first once
    the configuration names it, where it ran on to ``max_tokens``. (mlx-lm reads
    ``config.json``'s; 0.32 reads ``generation_config.json``'s first: both say it.)"""
    import json
    import shutil

    import mlx_lm

    model_dir = tmp_path / "eos"
    shutil.copytree(tiny_mild_dir, model_dir)
    model, _ = mlx_lm.load(str(model_dir))
    first = int(np.argmax(plain_logprobs(model, [1, 2, 3])))
    for name in ("config.json", "generation_config.json"):
        config = json.loads((model_dir / name).read_text())
        eos = config["eos_token_id"]
        assert first != eos
        config["eos_token_id"] = [eos, first]
        (model_dir / name).write_text(json.dumps(config))
    lm = MLXLM.from_name(str(model_dir))
    try:
        assert sorted(lm.vocab.eos_token_ids) == sorted([eos, first])
        assert asyncio.run(lm.sample([1, 2, 3], max_tokens=5, temperature=0)) == [first]
    finally:
        lm.close()
