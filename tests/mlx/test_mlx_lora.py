"""MLXLM's LoRA adapters against mlx-lm's own: the same adapter files loaded by
``mlx_lm.load(path, adapter_path=...)``, and a plain uncached forward pass of that model
(random adapters move rows by whole nats, far beyond the 1e-4 asked of two fp32 runs)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from support.mlx_reference import LORA_LAYOUT, plain_logprobs, save_lora_adapter

from genlm.backends.mlx import MLXLM
from genlm.core import UnknownVariantError

mx = pytest.importorskip("mlx.core")
mlx_lm = pytest.importorskip("mlx_lm")

#: Agreement required between MLXLM's rows and mlx-lm's plain forward, both in fp32.
ATOL = 1e-4
PROMPT = (1, 403, 407, 127, 263)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, stories_dir) -> list[Path]:
    """Two adapters of one layout (seeds 0 and 1)."""
    return [
        save_lora_adapter(tmp_path_factory.mktemp(f"mlx-lora-{seed}"), stories_dir, seed)
        for seed in (0, 1)
    ]


@pytest.fixture(scope="module")
def expected(stories_dir, adapters):
    """``(context, adapter index or None) -> row`` from mlx-lm's own loading and forward."""
    models = {None: mlx_lm.load(stories_dir)[0]}
    for i, path in enumerate(adapters):
        models[i] = mlx_lm.load(stories_dir, adapter_path=str(path))[0]

    def row(context, adapter=None) -> np.ndarray:
        return plain_logprobs(models[adapter], context)

    return row


@pytest.fixture
def lm(stories_dir):
    model = MLXLM.from_name(stories_dir)
    yield model
    model.close()


def test_rows_follow_each_requests_adapter_through_kv_reuse(lm, adapters, expected):
    """SMC-like steps under the base model and two adapters, each step's particles extending
    the last: every row equals mlx-lm's for its adapter, though the batches switch adapter
    each time and resume from kept KV (adapters keep theirs apart)."""
    lm.add_lora(adapters[0], "a")
    lm.add_lora(adapters[1], "b")
    particles = [PROMPT + (t,) for t in (300, 301, 302)]
    names = {None: None, "a": 0, "b": 1}
    for step in range(4):
        for variant, index in names.items():

            async def gathered(variant=variant, particles=particles):
                return await asyncio.gather(
                    *(lm.next_token_logprobs(p, variant=variant) for p in particles)
                )

            for particle, row in zip(particles, asyncio.run(gathered())):
                np.testing.assert_allclose(row, expected(particle, index), atol=ATOL)
        particles = [p + (310 + step,) for p in particles]
    # Each adapter's rows were kept under its own marker, and the adapters matter.
    last = [p[:-1] for p in particles]
    for name in ("a", "b"):
        marker = lm.adapters.get(name).marker
        assert all((marker, *p) in lm.kv_cache.prefixes for p in last)
    assert np.abs(expected(PROMPT, 0) - expected(PROMPT)).max() > 0.5


def test_a_removed_adapter_fails_queued_requests_and_its_name_serves_the_next_one(
    lm, adapters, expected
):
    """``remove_lora``: a request queued for the adapter fails with UnknownVariantError; the
    name loaded again with the other adapter serves its rows, also for a context whose
    prefix ran under the removed one (its KV is not the new adapter's)."""
    lm.add_lora(adapters[0], "x")
    lm.set_lora("x")
    np.testing.assert_allclose(lm.next_token_logprobs_sync(PROMPT), expected(PROMPT, 0), atol=ATOL)

    async def removed_while_queued():
        queued = asyncio.ensure_future(lm.next_token_logprobs(PROMPT + (5,), variant="x"))
        await asyncio.sleep(0)  # queued; its batch's flush is scheduled, not yet run
        lm.remove_lora("x")
        with pytest.raises(UnknownVariantError, match="'x' was removed"):
            await queued

    asyncio.run(removed_while_queued())
    assert lm.active_lora is None and lm.loaded_loras == ()
    lm.add_lora(adapters[1], "x")
    longer = PROMPT + (6,)
    np.testing.assert_allclose(
        lm.next_token_logprobs_sync(longer, variant="x"), expected(longer, 1), atol=ATOL
    )
    np.testing.assert_allclose(lm.next_token_logprobs_sync(longer), expected(longer), atol=ATOL)


def test_adapters_that_do_not_fit_are_refused_naming_why(
    lm, adapters, expected, tmp_path, stories_dir
):
    """Another layout than the first adapter's, a full fine-tune, arrays of other shapes,
    or no adapter at all: each is refused with what is wrong, and the model keeps serving
    the adapters it has."""
    lm.add_lora(adapters[0], "a")
    other = {"num_layers": 3, "lora_parameters": {"rank": 8, "scale": 2.0, "dropout": 0.0}}
    wider = save_lora_adapter(tmp_path / "wider", stories_dir, 2, other)
    with pytest.raises(ValueError, match="share their layout"):
        lm.add_lora(wider, "wider")
    full = tmp_path / "full"
    full.mkdir()
    (full / "adapter_config.json").write_text(json.dumps({"fine_tune_type": "full"}))
    with pytest.raises(ValueError, match="'full' fine-tune"):
        lm.add_lora(full, "full")
    misfit = tmp_path / "misfit"
    misfit.mkdir()
    (misfit / "adapter_config.json").write_text(
        json.dumps({"fine_tune_type": "lora", **LORA_LAYOUT})
    )
    mx.save_safetensors(
        str(misfit / "adapters.safetensors"),
        {"model.layers.4.self_attn.q_proj.lora_a": mx.zeros((3, 3))},
    )
    with pytest.raises(ValueError, match=r"shape \(3, 3\)[\s\S]*missing"):
        lm.add_lora(misfit, "misfit")
    unscaled = tmp_path / "unscaled"
    unscaled.mkdir()
    (unscaled / "adapter_config.json").write_text(
        json.dumps({"num_layers": 3, "lora_parameters": {"rank": 4}})
    )
    with pytest.raises(ValueError, match="lacks scale, dropout"):
        lm.add_lora(unscaled, "unscaled")
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        lm.add_lora(tmp_path / "nowhere", "nowhere")
    with pytest.raises(ValueError, match="'a' is already loaded"):
        lm.add_lora(adapters[1], "a")
    assert lm.loaded_loras == ("a",)
    np.testing.assert_allclose(
        lm.next_token_logprobs_sync(PROMPT, variant="a"), expected(PROMPT, 0), atol=ATOL
    )


def test_a_first_adapter_refused_leaves_the_model_as_it_was(lm, tmp_path, stories_dir, expected):
    """A first adapter refused after the model's layers were wrapped (its arrays do not
    fit), or while mlx-lm wrapped them (a module it cannot wrap, after some it did), leaves
    the model unwrapped: base rows as before, and an adapter of another layout loads next
    and serves mlx-lm's rows. A closed model forgets its adapters (and their arrays)."""
    misfit = tmp_path / "misfit"
    misfit.mkdir()
    (misfit / "adapter_config.json").write_text(
        json.dumps({"fine_tune_type": "lora", **LORA_LAYOUT})
    )
    mx.save_safetensors(str(misfit / "adapters.safetensors"), {"x.lora_a": mx.zeros((1,))})
    with pytest.raises(ValueError, match="does not fit"):
        lm.add_lora(misfit, "misfit")
    unwrappable = tmp_path / "unwrappable"
    unwrappable.mkdir()
    parameters = {**LORA_LAYOUT["lora_parameters"], "keys": ["self_attn.q_proj", "model.norm"]}
    (unwrappable / "adapter_config.json").write_text(
        json.dumps({"num_layers": 3, "lora_parameters": parameters})
    )
    with pytest.raises(ValueError, match="cannot put LoRA layers into this model"):
        lm.add_lora(unwrappable, "unwrappable")
    np.testing.assert_allclose(lm.next_token_logprobs_sync(PROMPT), expected(PROMPT), atol=ATOL)
    other = {"num_layers": 2, "lora_parameters": {"rank": 8, "scale": 1.0, "dropout": 0.0}}
    wider = save_lora_adapter(tmp_path / "wider", stories_dir, 3, other)
    lm.add_lora(wider, "wider")
    model = mlx_lm.load(stories_dir, adapter_path=str(wider))[0]
    np.testing.assert_allclose(
        lm.next_token_logprobs_sync(PROMPT, variant="wider"),
        plain_logprobs(model, PROMPT),
        atol=ATOL,
    )
    lm.close()
    assert lm.loaded_loras == ()


def test_dora_adapters_serve_mlx_lms_rows(lm, tmp_path, stories_dir):
    """DoRA adapters (magnitudes ``m`` besides A and B) serve mlx-lm's rows, beside the base
    model's, through resumed KV."""
    paths = [
        save_lora_adapter(tmp_path / f"d{seed}", stories_dir, seed, kind="dora") for seed in (4, 5)
    ]
    models = [mlx_lm.load(stories_dir, adapter_path=str(p))[0] for p in paths]
    base = mlx_lm.load(stories_dir)[0]
    for i, path in enumerate(paths):
        lm.add_lora(path, f"d{i}")
    context = PROMPT
    for token in (30, 31, 32):
        context = context + (token,)
        for i, model in enumerate(models):
            np.testing.assert_allclose(
                lm.next_token_logprobs_sync(context, variant=f"d{i}"),
                plain_logprobs(model, context),
                atol=ATOL,
            )
        np.testing.assert_allclose(
            lm.next_token_logprobs_sync(context), plain_logprobs(base, context), atol=ATOL
        )
    assert np.abs(plain_logprobs(models[0], PROMPT) - plain_logprobs(base, PROMPT)).max() > 0.5


def test_adapters_that_wrap_alike_load_together(lm, tmp_path, stories_dir):
    """Layouts compare by what shapes the wrap and the rows: ``num_layers`` -1 and the
    model's depth (5) wrap the same layers, and dropout (a training setting, off in
    evaluation) may differ; both adapters serve mlx-lm's rows."""
    parameters = LORA_LAYOUT["lora_parameters"]
    layouts = [
        {"num_layers": -1, "lora_parameters": parameters},
        {"num_layers": 5, "lora_parameters": {**parameters, "dropout": 0.1}},
    ]
    for i, layout in enumerate(layouts):
        path = save_lora_adapter(tmp_path / f"l{i}", stories_dir, 6 + i, layout)
        lm.add_lora(path, f"l{i}")
        model = mlx_lm.load(stories_dir, adapter_path=str(path))[0]
        np.testing.assert_allclose(
            lm.next_token_logprobs_sync(PROMPT, variant=f"l{i}"),
            plain_logprobs(model, PROMPT),
            atol=ATOL,
        )


def test_the_last_adapter_removed_or_a_close_gives_the_model_its_own_layers(
    adapters, tmp_path, stories_dir, expected
):
    """Once its last adapter is removed, the model's own layers are back: an adapter of
    another layout loads (it was refused for the first adapter's layout, on a model with
    none) and serves mlx-lm's rows. A model the caller handed over computes its base rows
    after close (it kept the active adapter's arrays, so its rows)."""
    model, tokenizer = mlx_lm.load(stories_dir)
    lm = MLXLM(model, tokenizer, cache_bytes=0)
    try:
        lm.add_lora(adapters[0], "a")
        np.testing.assert_allclose(
            lm.next_token_logprobs_sync(PROMPT, variant="a"), expected(PROMPT, 0), atol=ATOL
        )
        lm.remove_lora("a")
        np.testing.assert_allclose(lm.next_token_logprobs_sync(PROMPT), expected(PROMPT), atol=ATOL)
        other = {"num_layers": 2, "lora_parameters": {"rank": 8, "scale": 1.0, "dropout": 0.0}}
        wider = save_lora_adapter(tmp_path / "wider", stories_dir, 3, other)
        lm.add_lora(wider, "wider")
        reference = mlx_lm.load(stories_dir, adapter_path=str(wider))[0]
        lm.set_lora("wider")
        np.testing.assert_allclose(
            lm.next_token_logprobs_sync(PROMPT), plain_logprobs(reference, PROMPT), atol=ATOL
        )
    finally:
        lm.close()
    np.testing.assert_allclose(plain_logprobs(model, PROMPT), expected(PROMPT), atol=ATOL)


def test_replacing_an_adapter_keeps_it_until_the_new_one_has_loaded(
    lm, adapters, expected, tmp_path
):
    """``add_lora(..., replace=True)``: a path without an adapter fails and the name keeps
    serving its adapter (still active); the other adapter then takes the name, its rows
    mlx-lm's for that adapter, also for a context whose prefix ran under the replaced one.
    A closed model lists none, and its adapter calls raise ModelClosedError."""
    from genlm.core import ModelClosedError

    lm.add_lora(adapters[0], "x")
    lm.set_lora("x")
    np.testing.assert_allclose(lm.next_token_logprobs_sync(PROMPT), expected(PROMPT, 0), atol=ATOL)
    with pytest.raises(FileNotFoundError):
        lm.add_lora(tmp_path / "nowhere", "x", replace=True)
    assert lm.loaded_loras == ("x",) and lm.active_lora == "x"
    longer = PROMPT + (7,)
    np.testing.assert_allclose(lm.next_token_logprobs_sync(longer), expected(longer, 0), atol=ATOL)
    lm.add_lora(adapters[1], "x", replace=True)
    assert lm.loaded_loras == ("x",) and lm.active_lora == "x"
    longer += (8,)
    np.testing.assert_allclose(lm.next_token_logprobs_sync(longer), expected(longer, 1), atol=ATOL)
    lm.close()
    assert lm.loaded_loras == () and lm.active_lora is None
    for call in (lambda: lm.set_lora("x"), lm.clear_lora, lambda: lm.remove_lora("x")):
        with pytest.raises(ModelClosedError):
            call()
