"""The facade's ``AsyncMlxLM`` (genlm-backend 0.3's MLX class) over genlm-backend-mlx: its
documented arguments, ``from_name``'s defaults, and its caches' clearing."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core", reason="mlx is not installed")
mlx_lm = pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")
pytest.importorskip("genlm.backends.mlx", reason="genlm-backend-mlx is not installed")

import numpy as np  # noqa: E402

from genlm.backend import load_model_by_name  # noqa: E402
from genlm.backend.llm import AsyncMlxLM  # noqa: E402
from genlm.core.backend import resolve_model_path  # noqa: E402

#: The documented constructor's defaults (genlm-backend-api-mlx: batch_size=5, timeout=0.001).
DOCUMENTED = {"max_batch_size": 5, "max_wait_s": 0.001}


def options(llm: AsyncMlxLM) -> dict[str, float]:
    batcher = llm.core_lm.batcher
    return {"max_batch_size": batcher.max_batch_size, "max_wait_s": batcher.max_wait_s}


def test_constructor_and_from_name_take_the_documented_arguments_and_defaults(reference):
    """``cache_size`` and ``cache_opts`` are accepted by the constructor, ``from_name`` and
    ``load_model_by_name`` (0.3.1 takes both; ``cache_opts`` was a TypeError); ``from_name``
    applies the constructor's defaults (it gave core's, batches of 32 with no wait, where
    genlm-control and llamppl load through it); rows are those of a plain forward."""
    path = resolve_model_path("stories260K")
    model, tokenizer = mlx_lm.load(path)
    built = AsyncMlxLM(model, tokenizer, cache_size=0, cache_opts={})
    named = AsyncMlxLM.from_name(path, cache_size=4, cache_opts={})
    loaded = load_model_by_name(path, backend="mlx", llm_opts={"cache_size": 4, "cache_opts": {}})
    try:
        for llm in (built, named, loaded):
            assert options(llm) == DOCUMENTED
        chosen = AsyncMlxLM.from_name(path, batch_size=7, timeout=0.0)
        assert options(chosen) == {"max_batch_size": 7, "max_wait_s": 0.0}
        chosen.close()
        context = [1, 403, 407]
        expected = reference(context).numpy()
        for llm in (built, named, loaded):
            row = llm.next_token_logprobs_sync(context).numpy()
            np.testing.assert_allclose(row, expected, atol=1e-4)
    finally:
        for llm in (built, named, loaded):
            llm.close()


def test_clear_kv_cache_and_clear_cache_free_the_kv_and_mlx_buffers():
    """``clear_kv_cache`` drops the MLX backend's KV (it did nothing on mlx) and keeps the
    rows; ``clear_cache`` also empties MLX's buffer cache, as 0.3's documents."""
    llm = AsyncMlxLM.from_name(resolve_model_path("stories260K"))
    try:
        context = [1, 403, 407, 261]
        row = llm.next_token_logprobs_sync(context)
        assert llm.core_lm.kv_cache.nbytes > 0
        llm.clear_kv_cache()
        assert llm.core_lm.kv_cache.nbytes == 0 and mx.get_cache_memory() == 0
        assert llm.next_token_logprobs_sync(context).equal(row)  # the cached row
        llm.next_token_logprobs_sync(context + [378])  # freed temporaries MLX may keep
        llm.clear_cache()
        assert llm.core_lm.kv_cache.nbytes == 0 and mx.get_cache_memory() == 0
    finally:
        llm.close()


def test_adapters_load_replace_select_and_go_as_in_0_3_1(tmp_path):
    """``AsyncMlxLM`` takes 0.3.1's adapter calls (it raised NotImplementedError): an
    mlx-lm adapter loaded by ``add_new_lora`` serves ``lora_name=`` calls as mlx-lm's own
    loader and forward give them; loading under the same name replaces it; ``set_lora``
    and ``clear_lora`` move the default; ``remove_lora`` unloads it."""
    from support.mlx_reference import plain_logprobs, save_lora_adapter

    path = resolve_model_path("stories260K")
    saved = [save_lora_adapter(tmp_path / f"a{seed}", path, seed) for seed in (0, 1)]
    plain = [mlx_lm.load(path, adapter_path=str(s))[0] for s in saved]
    context = [1, 403, 407]
    llm = AsyncMlxLM.from_name(path)
    try:
        llm.add_new_lora(str(saved[0]), "x")
        row = llm.next_token_logprobs_sync(context, lora_name="x").numpy()
        np.testing.assert_allclose(row, plain_logprobs(plain[0], context), atol=1e-4)
        llm.add_new_lora(str(saved[1]), "x")  # replaced
        llm.set_lora(lora_name="x")
        row = llm.next_token_logprobs_sync(context).numpy()
        np.testing.assert_allclose(row, plain_logprobs(plain[1], context), atol=1e-4)
        llm.clear_lora()
        base = mlx_lm.load(path)[0]
        row = llm.next_token_logprobs_sync(context).numpy()
        np.testing.assert_allclose(row, plain_logprobs(base, context), atol=1e-4)
        llm.remove_lora("x")
        assert llm.core_lm.loaded_loras == ()
    finally:
        llm.close()
