"""Prefix KV reuse, its fallback for non-resumable caches, bf16 output and thread affinity."""

from __future__ import annotations

import logging
import threading

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from mlx_lm.models.cache import RotatingKVCache
from support.mlx_reference import plain_logprobs

from genlm.backends.mlx import MLXLM


class Spy(nn.Module):
    """Wraps an mlx-lm model, records each forward's input shape, optionally swaps its caches."""

    def __init__(self, inner, make_cache=None):
        super().__init__()
        self.inner = inner
        self.args = inner.args
        self._make_cache = make_cache
        self._shapes = []

    def __call__(self, inputs, cache=None):
        self._shapes.append(tuple(inputs.shape))
        return self.inner(inputs, cache=cache)

    @property
    def layers(self):
        return self.inner.layers

    def make_cache(self):
        return self._make_cache(self.inner) if self._make_cache else self.inner.make_cache()


@pytest.fixture(scope="module")
def stories(stories_dir):
    """stories260K as mlx-lm loads it: (model, TokenizerWrapper)."""
    return mlx_lm.load(stories_dir)


def test_extension_runs_only_new_tokens(stories):
    """A context extending a cached one runs only its new tokens, and gets the exact answer."""
    model, tokenizer = stories
    spy = Spy(model)
    lm = MLXLM(spy, tokenizer, cache_bytes=0)
    prompt = [1, 403, 407, 261, 378, 432]
    lm.next_token_logprobs_sync(prompt)
    rows = lm.batch_next_token_logprobs_sync([prompt + [383], prompt + [322, 260]])
    assert sum(b * n for b, n in spy._shapes) == 6 + 1 + 2
    for context, row in zip([prompt + [383], prompt + [322, 260]], rows):
        np.testing.assert_allclose(row, plain_logprobs(model, context), atol=1e-5)
    lm.close()


def test_clear_kv_cache_drops_the_kv_and_mlx_buffers_and_keeps_the_rows(stories):
    """``clear_kv_cache`` drops every prefix KV and the live batch (an extension then runs
    its whole context) and hands MLX's freed buffers back (its buffer cache empty, as 0.3's
    ``clear_cache`` leaves it); computed rows stay cached. ``clear_cache`` frees the
    buffers too; after close both do nothing."""
    model, tokenizer = stories
    spy = Spy(model)
    lm = MLXLM(spy, tokenizer)
    prompt = [1, 403, 407, 261, 378, 432]
    row = lm.next_token_logprobs_sync(prompt)
    # MLX keeps the forward's freed temporaries for reuse (newer releases do on the CPU
    # too; 0.29's CPU allocator keeps none, and then there is nothing to free).
    lm.clear_kv_cache()
    assert mx.get_cache_memory() == 0
    assert lm.kv_cache.nbytes == 0 and lm.kv_cache.live is None
    spy._shapes.clear()
    np.testing.assert_array_equal(lm.next_token_logprobs_sync(prompt), row)
    assert spy._shapes == []  # the row came from the output cache
    extended = lm.next_token_logprobs_sync(prompt + [383])
    assert sum(b * n for b, n in spy._shapes) == 7  # no KV left to resume from
    np.testing.assert_allclose(extended, plain_logprobs(model, prompt + [383]), atol=1e-5)
    lm.next_token_logprobs_sync(prompt + [322])
    lm.clear_cache()
    assert mx.get_cache_memory() == 0
    lm.close()
    lm.clear_kv_cache()
    lm.clear_cache()


def test_chunked_prefill_matches_plain_forward(stories):
    """Prefilling in chunks of 4 tokens, cold and resumed, gives the plain forward's answer."""
    model, tokenizer = stories
    spy = Spy(model)
    lm = MLXLM(spy, tokenizer, cache_bytes=0, prefill_chunk_size=4)
    context = [1, 403, 407, 261, 378, 432, 383, 322, 260, 11, 12, 13, 14]
    for n in (10, 13):
        row = lm.next_token_logprobs_sync(context[:n])
        np.testing.assert_allclose(row, plain_logprobs(model, context[:n]), atol=1e-5)
    assert max(n for _, n in spy._shapes) == 4
    assert sum(n for _, n in spy._shapes) == 13
    with pytest.raises(ValueError, match="prefill_chunk_size"):
        MLXLM(model, tokenizer, prefill_chunk_size=0)
    for bad in (2.5, None):  # 2.5 failed every request, None a bare comparison TypeError
        with pytest.raises(TypeError, match="prefill_chunk_size must be an integer"):
            MLXLM(model, tokenizer, prefill_chunk_size=bad)
    with pytest.raises(TypeError, match="kv_cache_bytes must be"):
        MLXLM(model, tokenizer, kv_cache_bytes=1.5)
    lm.close()


def test_kv_budget_bounds_the_cache(stories):
    """The prefix cache stays within kv_cache_bytes, and a zero budget turns reuse off."""
    model, tokenizer = stories
    lm = MLXLM(model, tokenizer, cache_bytes=0, kv_cache_bytes=20_000)
    for n in range(2, 12):
        lm.next_token_logprobs_sync(list(range(1, n + 20)))
        assert lm.kv_cache.nbytes <= 20_000
    lm.close()
    spy = Spy(model)
    off = MLXLM(spy, tokenizer, cache_bytes=0, kv_cache_bytes=0)
    off.next_token_logprobs_sync([1, 2, 3])
    off.next_token_logprobs_sync([1, 2, 3, 4])
    assert sum(b * n for b, n in spy._shapes) == 3 + 4 and len(off.kv_cache) == 0
    off.close()


def test_rotating_cache_with_keep_falls_back_with_one_warning(stories, caplog):
    """RotatingKVCache(keep=4) layers give one warning, full recomputation and exact results."""
    model, tokenizer = stories
    spy = Spy(model, lambda m: [RotatingKVCache(max_size=1024, keep=4) for _ in m.layers])
    with caplog.at_level(logging.WARNING, logger="genlm.backends.mlx._model"):
        lm = MLXLM(spy, tokenizer, cache_bytes=0)
        contexts = [[1, 403, 407], [1, 403, 407, 261], [1, 9, 8, 7], [1, 403, 407, 261, 378]]
        lm.next_token_logprobs_sync(contexts[0])
        rows = lm.batch_next_token_logprobs_sync(contexts[1:])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "RotatingKVCache" in warnings[0].getMessage()
    assert not lm.resumable
    # Whole contexts (3, then 4 + 4 + 5 tokens), the two of length 4 in one pass.
    assert sum(b * n for b, n in spy._shapes) == 3 + 4 + 4 + 5
    assert max(b for b, _ in spy._shapes) == 2
    for context, row in zip(contexts[1:], rows):
        np.testing.assert_allclose(row, plain_logprobs(model, context), atol=1e-5)
    lm.close()


def test_state_space_model_falls_back(stories_dir, caplog):
    """A Mamba model (ArraysCache) warns once and matches its own uncached forward."""
    from mlx_lm.models import mamba
    from transformers import AutoTokenizer

    args = mamba.ModelArgs(
        model_type="mamba",
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        state_size=8,
        num_hidden_layers=2,
        conv_kernel=4,
        use_bias=False,
        use_conv_bias=True,
        time_step_rank=4,
    )
    mx.random.seed(0)
    model = mamba.Model(args)
    with caplog.at_level(logging.WARNING, logger="genlm.backends.mlx._model"):
        lm = MLXLM(model, AutoTokenizer.from_pretrained(stories_dir), cache_bytes=0)
    # mlx-lm 0.32 names Mamba's state cache ArraysCache; 0.30 and 0.31 MambaCache.
    [warning] = [r.getMessage() for r in caplog.records if "cannot resume" in r.getMessage()]
    assert "ArraysCache" in warning or "MambaCache" in warning
    contexts = [[1, 5, 9], [1, 5, 9, 11], [1, 5, 10]]
    rows = lm.batch_next_token_logprobs_sync(contexts)
    for context, row in zip(contexts, rows):
        np.testing.assert_allclose(row, plain_logprobs(model, context), atol=1e-5)
    lm.close()


def _batch_unsafe_model(model_type: str):
    """A small random model of ``model_type`` whose forward broke on batched rows
    resumed with BatchKVCache (weights scaled up, so wrong rows differ clearly)."""
    import importlib

    from mlx.utils import tree_map

    config = dict(
        model_type=model_type,
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    )
    if model_type == "gemma2":
        config.update(
            head_dim=16,
            query_pre_attn_scalar=16,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
        )
    elif model_type == "internlm2":
        config.update(max_position_embeddings=512, tie_word_embeddings=False, bias=False)
    elif model_type == "gpt_bigcode":
        config.update(
            n_embd=64, n_layer=2, n_inner=128, n_head=4, n_positions=512, layer_norm_epsilon=1e-5
        )
    elif model_type == "phi3":  # "longrope" (as Phi-3-mini-128k)
        factors = {"short_factor": [1.0] * 8, "long_factor": [4.0] * 8}
        config.update(
            max_position_embeddings=512,
            original_max_position_embeddings=64,
            rope_scaling={"type": "longrope", **factors},
        )
    else:  # llama with a RoPE scaled by the sequence length
        config.update(max_position_embeddings=512, rope_scaling={"type": "dynamic", "factor": 2.0})
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(0)
    try:
        model = module.Model(module.ModelArgs.from_dict(config))
    except ValueError as exc:  # mlx-lm 0.30 has no dynamic RoPE for llama
        pytest.skip(f"this mlx-lm cannot build it: {exc}")
    model.update(tree_map(lambda p: p * 3 if p.ndim == 2 else p, model.parameters()))
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("model_type", ["gemma2", "gpt_bigcode", "internlm2", "llama", "phi3"])
def test_models_broken_by_batched_resumes_equal_their_plain_forward(
    stories_dir, model_type, caplog
):
    """gemma2, gpt_bigcode, and models with a RoPE scaled by the sequence length (llama
    with dynamic rope_scaling; internlm2's own before mlx-lm 0.32; phi3's "longrope"
    before mlx-lm 0.31) recompute instead of resuming a batch from stored KV: rows of
    different cached lengths, and equal fresh contexts, equal each context's own forward
    (gemma2's were off by nats or failed to broadcast, the others' every batch of two
    resumed rows failed)."""
    from transformers import AutoTokenizer

    model = _batch_unsafe_model(model_type)
    with caplog.at_level(logging.WARNING, logger="genlm.backends.mlx._model"):
        lm = MLXLM(model, AutoTokenizer.from_pretrained(stories_dir), cache_bytes=0)
    if not lm.resumable:
        assert any("recomputes its whole context" in r.getMessage() for r in caplog.records)
    try:
        lm.next_token_logprobs_sync([1, 2, 3, 4, 5, 6])
        lm.next_token_logprobs_sync([1, 7])
        for batch in (
            [[1, 2, 3, 4, 5, 6, 9], [1, 7, 9]],
            [[1, 5, 6, 7, 8], [1, 5, 6, 7, 9], [1, 5, 6, 7, 10]],
        ):
            rows = lm.batch_next_token_logprobs_sync(batch)
            for context, row in zip(batch, rows):
                np.testing.assert_allclose(row, plain_logprobs(model, context), atol=1e-4)
    finally:
        lm.close()


def test_bf16_model_returns_float32_close_to_fp32(stories_dir):
    """A bf16 model yields float32 rows within bf16 accuracy of the fp32 model."""
    fp32 = MLXLM.from_name(stories_dir, cache_bytes=0)
    model, tokenizer = mlx_lm.load(stories_dir)
    model.set_dtype(mx.bfloat16)
    bf16 = MLXLM(model, tokenizer, cache_bytes=0)
    contexts = [[1, 403, 407, 261, 378], [1, 403, 407], [1, 403, 407, 261, 378, 432]]
    rows = bf16.batch_next_token_logprobs_sync(contexts)
    assert rows.dtype == np.float32
    expected = fp32.batch_next_token_logprobs_sync(contexts)
    # bf16 keeps ~3 significant digits through 5 layers: compare where the mass is.
    likely = expected > -10
    np.testing.assert_allclose(rows[likely], expected[likely], atol=0.4)
    np.testing.assert_array_equal(rows.argmax(1), expected.argmax(1))
    assert np.abs(rows - expected).max() > 0  # really computed in bf16
    fp32.close()
    bf16.close()


def test_model_built_on_another_thread_with_lazy_buffers(stories_dir):
    """A model with lazy private buffers (Llama 3 RoPE) works when wrapped where it was built."""
    result = {}

    def build_and_query():
        model, tokenizer = mlx_lm.load(
            stories_dir,
            model_config={
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 256,
                }
            },
        )
        lm = MLXLM(model, tokenizer, cache_bytes=0)
        result["row"] = lm.next_token_logprobs_sync([1, 403, 407])
        result["expected"] = plain_logprobs(model, [1, 403, 407])
        lm.close()

    thread = threading.Thread(target=build_and_query)
    thread.start()
    thread.join()
    np.testing.assert_allclose(result["row"], result["expected"], atol=1e-5)


def test_live_batch_follows_resampled_particles(stories):
    """Steps that extend the last batch (rows repeated, permuted, dropped) run one token per
    row in place, match a plain forward, and leave every context findable in the KV cache."""
    model, tokenizer = stories
    spy = Spy(model)
    lm = MLXLM(spy, tokenizer, cache_bytes=0)
    prompt = [1, 403, 407, 261, 378, 432]
    particles = [prompt + [t] for t in (383, 322, 260, 11)]
    lm.batch_next_token_logprobs_sync(particles)
    rng = np.random.default_rng(0)
    for _ in range(4):
        # Resample: duplicates and a permutation, then one new token each.
        parents = [particles[i] for i in rng.choice(len(particles), 5)]
        particles = [p + [int(t)] for p, t in zip(parents, rng.integers(3, 500, 5))]
        spy._shapes.clear()
        rows = lm.batch_next_token_logprobs_sync(particles)
        distinct = len(set(map(tuple, particles)))
        assert spy._shapes == [(distinct, 1)]  # only the new tokens, one forward pass
        for particle, row in zip(particles, rows):
            np.testing.assert_allclose(row, plain_logprobs(model, particle), atol=1e-5)
            assert lm.kv_cache.longest_prefix(particle).length == len(particle)
    # Two new tokens per row also extend the live batch in place.
    particles = [p + [7, 8] for p in particles[:3]]
    spy._shapes.clear()
    rows = lm.batch_next_token_logprobs_sync(particles)
    assert sum(b * n for b, n in spy._shapes) == 3 * 2
    for particle, row in zip(particles, rows):
        np.testing.assert_allclose(row, plain_logprobs(model, particle), atol=1e-5)
    lm.close()


def test_batch_not_extending_the_live_batch_resumes_from_its_rows(stories):
    """A batch that breaks the pattern (other lengths, other prompts) still runs only new
    tokens over the last batch's rows (copied out to the prefix cache), and is exact."""
    model, tokenizer = stories
    spy = Spy(model)
    lm = MLXLM(spy, tokenizer, cache_bytes=0)
    prompt = [1, 403, 407, 261, 378, 432]
    a, b = prompt + [383], prompt + [322]
    lm.next_token_logprobs_sync(prompt)
    lm.batch_next_token_logprobs_sync([a, b])  # live, in place
    lm.batch_next_token_logprobs_sync([a + [5], b + [6]])  # live, in place
    contexts = [a + [5, 9, 10], b + [6, 11], prompt + [12], [1, 9, 8]]
    spy._shapes.clear()
    rows = lm.batch_next_token_logprobs_sync(contexts)
    assert sum(b * n for b, n in spy._shapes) == 2 + 1 + 1 + 3
    for context, row in zip(contexts, rows):
        np.testing.assert_allclose(row, plain_logprobs(model, context), atol=1e-5)
    # The rows of the replaced live batch were copied out, and so was the batch just run.
    assert lm.kv_cache.longest_prefix(a + [5, 0]).length == len(a) + 1
    spy._shapes.clear()
    rows = lm.batch_next_token_logprobs_sync([a + [5, 13], contexts[3] + [14]])
    assert sum(b * n for b, n in spy._shapes) == 2
    for context, row in zip([a + [5, 13], contexts[3] + [14]], rows):
        np.testing.assert_allclose(row, plain_logprobs(model, context), atol=1e-5)
    lm.close()


@pytest.mark.parametrize("budget", [200_000, 3_000_000])
def test_kv_budget_bounds_the_live_batch(stories, budget):
    """The live batch counts towards kv_cache_bytes (3 MB keeps it, 200 kB does not: its
    buffers grow 256 positions at a time), and the rows stay exact either way."""
    model, tokenizer = stories
    lm = MLXLM(model, tokenizer, cache_bytes=0, kv_cache_bytes=budget)
    particles = [[1, 403, 407, 261, 378, t] for t in range(10, 18)]
    for step in range(40):
        rows = lm.batch_next_token_logprobs_sync(particles)
        assert lm.kv_cache.nbytes <= budget
        if lm.kv_cache.live is not None:  # charged to the budget
            assert lm.kv_cache.live.nbytes <= lm.kv_cache.nbytes <= budget
        assert (lm.kv_cache.live is not None and not lm.kv_cache.live.copied) == (
            budget > 1e6 and step > 0
        )
        if step % 13 == 0:
            for particle, row in zip(particles, rows):
                np.testing.assert_allclose(row, plain_logprobs(model, particle), atol=1e-5)
        particles = [p + [int(np.argmax(r))] for p, r in zip(particles, rows)]
    lm.close()


def test_failed_step_drops_the_live_batch(stories, monkeypatch):
    """A forward that fails mid-step leaves no half-advanced live batch behind."""
    model, tokenizer = stories
    lm = MLXLM(model, tokenizer, cache_bytes=0)
    particles = [[1, 403, 407, 261, 378, t] for t in (10, 11)]
    lm.batch_next_token_logprobs_sync(particles)
    lm.batch_next_token_logprobs_sync([p + [5] for p in particles])
    calls = []

    def fail_once(tokens, cache):
        calls.append(1)
        raise RuntimeError("boom")

    with monkeypatch.context() as patch:
        patch.setattr(lm, "_last_logits", fail_once)
        with pytest.raises(RuntimeError, match="boom"):
            lm.batch_next_token_logprobs_sync([p + [5, 6] for p in particles])
    assert calls and lm.kv_cache.live is None
    contexts = [p + [5, 6] for p in particles]
    for context, row in zip(contexts, lm.batch_next_token_logprobs_sync(contexts)):
        np.testing.assert_allclose(row, plain_logprobs(model, context), atol=1e-5)
    lm.close()


def test_a_batch_refused_for_nan_rows_leaves_no_kv_behind(stories_dir, monkeypatch):
    """A forward whose rows come out NaN (core refuses the batch) keeps none of their KV,
    stored or live: the contexts, and continuations of them, asked again alone once the
    model computes normally, equal a plain forward (they resumed from the NaN KV and
    failed too, until clear_kv_cache). Both ways a batch runs: a fresh one, and the live
    batch extended in place."""
    from genlm.core import BackendError

    model, tokenizer = mlx_lm.load(stories_dir)
    lm = MLXLM(model, tokenizer, cache_bytes=0)
    layer = type(model.model.layers[0])
    computes = layer.__call__
    prompt = (1, 403, 407, 261, 378)
    try:
        lm.batch_next_token_logprobs_sync([prompt, prompt[:3] + (9, 10)])  # kept live
        monkeypatch.setattr(
            layer, "__call__", lambda self, *a, **k: computes(self, *a, **k) * mx.nan
        )
        for batch in ([prompt + (11,), prompt[:3] + (9, 10, 12)], [prompt[:4], (1, 20, 30)]):
            with pytest.raises(BackendError, match="NaN"):
                lm.batch_next_token_logprobs_sync(batch)
        monkeypatch.undo()
        for context in (
            prompt + (11, 13),
            prompt[:3] + (9, 10, 12),
            prompt[:4] + (5,),
            (1, 20, 30),
        ):
            np.testing.assert_allclose(
                lm.next_token_logprobs_sync(context), plain_logprobs(model, context), atol=1e-4
            )
    finally:
        lm.close()


def test_clear_cache_after_the_weights_changed_serves_the_new_weights(stories_dir):
    """The caller changes the model's weights on its own thread (lazy arrays of that
    thread), then calls clear_cache, as core documents: the next rows are the new weights'
    (a plain forward of the changed model). On MLX 0.30 and later every request failed:
    the worker may not evaluate another thread's lazy arrays."""
    from mlx.utils import tree_map

    model, tokenizer = mlx_lm.load(stories_dir)
    lm = MLXLM(model, tokenizer)
    context = [1, 403, 407, 261]
    before = lm.next_token_logprobs_sync(context)
    model.update(tree_map(lambda p: p * 1.5, model.parameters()))
    lm.clear_cache()
    try:
        for ids in (context, context + [5]):
            np.testing.assert_allclose(
                lm.next_token_logprobs_sync(ids), plain_logprobs(model, ids), atol=1e-5
            )
    finally:
        lm.close()
    assert np.abs(before - plain_logprobs(model, context)).max() > 1e-2  # the weights changed
