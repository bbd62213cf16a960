"""LoRA adapters through peft: results equal a merged model, and adapters never share KV."""

from __future__ import annotations

import asyncio
import warnings

import numpy as np
import pytest

peft = pytest.importorskip("peft")

from genlm.backends.hf import HFLM  # noqa: E402
from genlm.core.backend import resolve_model_path  # noqa: E402

STORIES = resolve_model_path("stories260K")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load_base(torch, transformers, dtype):
    return transformers.AutoModelForCausalLM.from_pretrained(STORIES).to(dtype).eval()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two random adapters (non-zero B matrices) saved to disk, and their merged models (fp64)."""
    import torch
    import transformers

    out = {}
    for name, seed in (("a", 1), ("b", 2)):
        torch.manual_seed(seed)
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False)
        model = peft.get_peft_model(load_base(torch, transformers, torch.float32), config)
        path = tmp_path_factory.mktemp(f"lora-{name}")
        model.save_pretrained(path)
        merged = peft.PeftModel.from_pretrained(load_base(torch, transformers, torch.float64), path)
        out[name] = (path, merged.merge_and_unload().eval())
    return out


@pytest.fixture
def lm(adapters):
    """An fp64 stories260K HFLM with both adapters loaded and the base model active."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(STORIES)
    model = HFLM(load_base(torch, transformers, torch.float64), tok, cache_bytes=0, max_wait_s=0.05)
    for name, (path, _) in adapters.items():
        model.add_lora(path, name)
    yield model
    model.close()


@pytest.fixture
def base_model():
    import torch
    import transformers

    return load_base(torch, transformers, torch.float64)


CONTEXTS = [[1, 403, 407, 261, 378], [1, 20, 30], [1, 403, 407, 261, 378, 11, 12, 13]]


def test_adapter_matches_merged_model(lm, adapters, base_model, check):
    """Each adapter's rows equal its merged model's full forward; clear_lora gives the base."""
    for name in ("a", "b"):
        lm.set_lora(name)
        rows = lm.batch_next_token_logprobs_sync(CONTEXTS)
        for context, row in zip(CONTEXTS, rows):
            check(adapters[name][1], context, row)
    lm.clear_lora()
    for context, row in zip(CONTEXTS, lm.batch_next_token_logprobs_sync(CONTEXTS)):
        check(base_model, context, row)


def test_request_uses_adapter_active_when_made(lm, adapters, base_model, check):
    """Switching adapters while requests wait does not change what those requests compute."""

    async def scenario():
        lm.set_lora("a")
        first = asyncio.ensure_future(lm.next_token_logprobs(CONTEXTS[0]))
        await asyncio.sleep(0)  # the request is made (and queued) under adapter a
        lm.set_lora("b")
        second = asyncio.ensure_future(lm.next_token_logprobs(CONTEXTS[0]))
        await asyncio.sleep(0)
        lm.clear_lora()
        third = asyncio.ensure_future(lm.next_token_logprobs(CONTEXTS[0]))
        return await asyncio.gather(first, second, third)

    a, b, base = asyncio.run(scenario())
    check(adapters["a"][1], CONTEXTS[0], a)
    check(adapters["b"][1], CONTEXTS[0], b)
    check(base_model, CONTEXTS[0], base)


def test_adapters_never_reuse_each_others_kv(lm, adapters, base_model, check):
    """KV cached under one adapter is invisible to another; within an adapter it is reused."""
    prompt = CONTEXTS[2]
    lm.next_token_logprobs_sync(prompt)  # base KV for the prompt
    lm.set_lora("a")
    before = lm.kv_stats["computed_tokens"]
    check(adapters["a"][1], prompt + [40], lm.next_token_logprobs_sync(prompt + [40]))
    assert lm.kv_stats["computed_tokens"] - before == len(prompt) + 1
    before = lm.kv_stats["computed_tokens"]
    check(adapters["a"][1], prompt + [40, 41], lm.next_token_logprobs_sync(prompt + [40, 41]))
    assert lm.kv_stats["computed_tokens"] - before == 1
    lm.clear_lora()
    before = lm.kv_stats["computed_tokens"]
    check(base_model, prompt + [40], lm.next_token_logprobs_sync(prompt + [40]))
    assert lm.kv_stats["computed_tokens"] - before == 1


def test_cache_kv_pins_under_the_active_adapter(lm, adapters, check):
    """cache_kv under an adapter serves that adapter's later requests from the pinned KV."""
    lm.set_lora("b")
    lm.cache_kv(CONTEXTS[2])
    before = lm.kv_stats["computed_tokens"]
    row = lm.next_token_logprobs_sync(CONTEXTS[2] + [50])
    assert lm.kv_stats["computed_tokens"] - before == 1
    check(adapters["b"][1], CONTEXTS[2] + [50], row)


def test_unknown_or_duplicate_adapter_is_a_clear_error(lm, adapters):
    """Selecting a missing adapter or reusing a name fails with the name in the message."""
    with pytest.raises(KeyError, match="nope"):
        lm.set_lora("nope")
    with pytest.raises(ValueError, match="'a'"):
        lm.add_lora(adapters["a"][0], "a")
    assert lm.loaded_loras == ("a", "b")  # in load order; the duplicate was not added
    assert np.isfinite(lm.next_token_logprobs_sync(CONTEXTS[1])).all()


def test_per_request_variant_without_touching_state(lm, adapters, base_model, check):
    """``variant=`` picks the adapter of one request; concurrent requests under a, b and the base
    model each get their own adapter's rows, and the model's active adapter never changes."""

    async def scenario():
        return await asyncio.gather(
            lm.next_token_logprobs(CONTEXTS[0], variant="a"),
            lm.next_token_logprobs(CONTEXTS[0], variant="b"),
            lm.next_token_logprobs(CONTEXTS[0]),
            lm.batch_next_token_logprobs(CONTEXTS[:2], variant="b"),
        )

    a, b, base, batch_b = asyncio.run(scenario())
    assert lm.active_lora is None
    check(adapters["a"][1], CONTEXTS[0], a)
    check(adapters["b"][1], CONTEXTS[0], b)
    check(base_model, CONTEXTS[0], base)
    for context, row in zip(CONTEXTS[:2], batch_b):
        check(adapters["b"][1], context, row)
    lm.set_lora("a")  # variant=None asks for the base model even while an adapter is active
    check(base_model, CONTEXTS[1], lm.next_token_logprobs_sync(CONTEXTS[1], variant=None))
    with pytest.raises(KeyError, match="nope"):
        lm.next_token_logprobs_sync(CONTEXTS[1], variant="nope")


def test_remove_lora_drops_its_state_and_the_name_can_be_loaded_again(adapters, check):
    """remove_lora("a") unloads it with its KV (a pinned prompt included) and its cached
    rows; "a" loaded again from b's weights serves b's rows, never a's stale KV or rows;
    "b" is untouched, and an active adapter removed leaves the base model active."""
    import torch
    import transformers

    from genlm.core import UnknownVariantError

    tok = transformers.AutoTokenizer.from_pretrained(STORIES)
    lm = HFLM(load_base(torch, transformers, torch.float64), tok)  # output cache on
    try:
        for name, (path, _) in adapters.items():
            lm.add_lora(path, name)
        prompt = CONTEXTS[2]
        lm.cache_kv(prompt, variant="a")  # pinned under "a", whatever is active
        assert lm.active_lora is None
        check(
            adapters["a"][1], prompt + [40], lm.next_token_logprobs_sync(prompt + [40], variant="a")
        )
        check(
            adapters["b"][1], prompt + [40], lm.next_token_logprobs_sync(prompt + [40], variant="b")
        )
        kv_entries = len(lm.kv)
        lm.set_lora("a")
        lm.remove_lora("a")
        assert lm.loaded_loras == ("b",) and lm.active_lora is None
        assert 0 < len(lm.kv) < kv_entries and len(lm.output_cache) == 0
        with pytest.raises(UnknownVariantError, match="'a'"):
            lm.next_token_logprobs_sync(prompt, variant="a")
        with pytest.raises(UnknownVariantError, match="'a'"):
            lm.remove_lora("a")
        lm.add_lora(adapters["b"][0], "a")  # the name again, other weights
        before = lm.kv_stats["computed_tokens"]
        row = lm.next_token_logprobs_sync(prompt + [40], variant="a")
        assert lm.kv_stats["computed_tokens"] - before == len(prompt) + 1  # nothing reused
        check(adapters["b"][1], prompt + [40], row)
        check(
            adapters["b"][1], prompt + [41], lm.next_token_logprobs_sync(prompt + [41], variant="b")
        )
    finally:
        lm.close()


def test_a_request_after_the_name_is_loaded_again_never_joins_the_old_adapters_batch(
    adapters, reference
):
    """remove_lora("a") then add_lora(b's weights, "a") while a request under the old "a"
    is in flight: a request made afterwards is computed anew under the new weights (it
    joined the old computation and got the old adapter's row)."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(STORIES)
    lm = HFLM(load_base(torch, transformers, torch.float64), tok)  # dedup on, no wait
    context = CONTEXTS[2] * 4

    async def main():
        old = asyncio.ensure_future(lm.next_token_logprobs(context, variant="a"))
        await asyncio.sleep(0)  # it submits ...
        await asyncio.sleep(0)  # ... and its batch goes to the worker
        lm.remove_lora("a")  # blocking calls on the loop: the old batch is not yet delivered
        lm.add_lora(adapters["b"][0], "a")
        async with asyncio.timeout(30):  # no new task: the request is made right now
            new = await lm.next_token_logprobs(context, variant="a")
        return await asyncio.wait_for(old, 30), new

    try:
        for name, (path, _) in adapters.items():
            lm.add_lora(path, name)
        old, new = asyncio.run(main())
    finally:
        lm.close()
    # peft 0.4.0 (the lora extra's floor) keeps an adapter's weights in float32 in a
    # float64 model, so over these 32 tokens rows differ from the merged float64 model by
    # up to about 1e-5; newer peft casts them to the model's dtype. Two adapters' rows
    # differ by whole nats.
    np.testing.assert_allclose(old, reference(adapters["a"][1], context), atol=1e-4, rtol=0)
    np.testing.assert_allclose(new, reference(adapters["b"][1], context), atol=1e-4, rtol=0)
    assert np.abs(new - old).max() > 0.1


def test_two_callers_loading_one_name_get_it_once(lm, adapters):
    """add_lora's "already loaded" check runs on the worker: of two threads loading one
    name at once, one loads it and the other gets the ValueError (both succeeded, and the
    last load won silently)."""
    import threading

    barrier, outcomes = threading.Barrier(2), []

    def load(name):
        barrier.wait(10)
        try:
            lm.add_lora(adapters[name][0], "c")
            outcomes.append(name)
        except ValueError as error:
            outcomes.append(error)

    threads = [threading.Thread(target=load, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    errors = [o for o in outcomes if isinstance(o, ValueError)]
    assert len(outcomes) == 2 and len(errors) == 1
    assert "adapter named 'c' is already loaded" in str(errors[0])


def test_removing_the_only_adapter_leaves_the_base_model_serving(adapters, base_model, check):
    """With its only adapter removed the model serves base rows (a PeftModel left with no
    adapter failed every request) and can load an adapter again."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(STORIES)
    lm = HFLM(load_base(torch, transformers, torch.float64), tok, cache_bytes=0)
    try:
        lm.add_lora(adapters["a"][0], "a")
        lm.set_lora("a")
        lm.remove_lora("a")
        assert lm.loaded_loras == () and lm.active_lora is None
        check(base_model, CONTEXTS[1], lm.next_token_logprobs_sync(CONTEXTS[1]))
        lm.add_lora(adapters["b"][0], "b")
        check(adapters["b"][1], CONTEXTS[1], lm.next_token_logprobs_sync(CONTEXTS[1], variant="b"))
        check(base_model, CONTEXTS[0], lm.next_token_logprobs_sync(CONTEXTS[0]))
    finally:
        lm.close()


def test_close_gives_the_callers_model_back_as_it_was(adapters, base_model, check, reference):
    """add_lora puts peft's layers into the model the caller handed over; close() takes them
    out again, as removing the last adapter does, so that model computes its base rows (it
    kept the active adapter's, up to 18 nats off, and a new HFLM over it served them as the
    base model's)."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(STORIES)
    model = load_base(torch, transformers, torch.float64)
    lm = HFLM(model, tok, cache_bytes=0)
    lm.add_lora(adapters["a"][0], "a")
    lm.set_lora("a")
    check(adapters["a"][1], CONTEXTS[0], lm.next_token_logprobs_sync(CONTEXTS[0]))
    lm.close()
    for context in CONTEXTS:
        np.testing.assert_allclose(reference(model, context), reference(base_model, context))
    again = HFLM(model, tok, cache_bytes=0)
    try:
        check(base_model, CONTEXTS[1], again.next_token_logprobs_sync(CONTEXTS[1]))
    finally:
        again.close()


def test_close_gives_a_callers_peft_model_back_as_it_came(adapters, reference):
    """A PeftModel handed over with its own adapter active is given back at close without
    the adapters loaded here and with its own adapter active again (it kept the last
    adapter used, so its rows)."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(STORIES)
    mine = peft.PeftModel.from_pretrained(
        load_base(torch, transformers, torch.float64), adapters["a"][0], adapter_name="a"
    ).eval()
    before = [reference(mine, context) for context in CONTEXTS]
    lm = HFLM(mine, tok, cache_bytes=0)
    lm.add_lora(adapters["b"][0], "b")
    lm.set_lora("b")
    lm.next_token_logprobs_sync(CONTEXTS[0])
    lm.close()
    assert list(mine.peft_config) == ["a"] and mine.active_adapter == "a"
    for context, row in zip(CONTEXTS, before):
        np.testing.assert_allclose(reference(mine, context), row)


@pytest.fixture(scope="module")
def misfit(tmp_path_factory):
    """An adapter saved for another model (stories260K with a wider MLP): peft fails to
    load its weights into stories260K, after putting in their layers."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(STORIES)
    config.intermediate_size = 200
    torch.manual_seed(0)
    sibling = transformers.AutoModelForCausalLM.from_config(config)
    lora = peft.LoraConfig(r=4, target_modules=TARGETS, init_lora_weights=False)
    path = tmp_path_factory.mktemp("misfit")
    peft.get_peft_model(sibling, lora).save_pretrained(path)
    return path


def test_a_first_adapter_that_fails_to_load_leaves_the_base_model_as_it_was(
    tmp_path, misfit, base_model, check
):
    """An adapter saved for another model (a wider MLP) fails to load as the first one, and
    the base model's rows are still its plain forward (peft's layers, put in before its
    weights failed to load, stayed in the model: rows were off by 12-19 nats); a good
    adapter then loads and serves."""
    import torch
    import transformers

    lora = peft.LoraConfig(r=4, target_modules=TARGETS, init_lora_weights=False)
    torch.manual_seed(1)
    good = peft.get_peft_model(load_base(torch, transformers, torch.float32), lora)
    good.save_pretrained(tmp_path / "good")
    tok = transformers.AutoTokenizer.from_pretrained(STORIES)
    lm = HFLM(load_base(torch, transformers, torch.float64), tok, cache_bytes=0)
    try:
        with pytest.raises(RuntimeError):
            lm.add_lora(misfit, "other")
        assert lm.loaded_loras == ()
        for context in CONTEXTS:
            check(base_model, context, lm.next_token_logprobs_sync(context))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lm.add_lora(tmp_path / "good", "good")
        assert not [w for w in caught if "peft_config" in str(w.message)]  # none left behind
        for context in CONTEXTS:
            check(base_model, context, lm.next_token_logprobs_sync(context, variant=None))
        assert (
            np.abs(
                lm.next_token_logprobs_sync(CONTEXTS[0], variant="good")
                - lm.next_token_logprobs_sync(CONTEXTS[0], variant=None)
            ).max()
            > 1e-3
        )
    finally:
        lm.close()


def test_replacing_an_adapter_keeps_it_until_the_new_one_has_loaded(
    lm, adapters, misfit, tmp_path, base_model, check
):
    """``add_lora(..., replace=True)``: a path without an adapter, or an adapter of another
    model, fails and leaves the adapter loaded, active and serving its rows, with nothing of
    the failed load left in peft; b's weights then take the name (still active, loaded
    last), its rows are b's and the replaced adapter's KV is never reused; with both
    adapters removed the model is the plain one again (one peft adapter per loaded name)."""
    lm.set_lora("a")
    prompt = CONTEXTS[2]
    check(adapters["a"][1], prompt, lm.next_token_logprobs_sync(prompt))
    for bad, error in ((tmp_path / "nowhere", ValueError), (misfit, RuntimeError)):
        with pytest.raises(error):
            lm.add_lora(bad, "a", replace=True)
        assert lm.loaded_loras == ("a", "b") and lm.active_lora == "a"
        assert len(lm.model.peft_config) == 2
        check(adapters["a"][1], prompt + [40], lm.next_token_logprobs_sync(prompt + [40]))
    lm.add_lora(adapters["b"][0], "a", replace=True)
    assert lm.loaded_loras == ("b", "a") and lm.active_lora == "a"
    assert len(lm.model.peft_config) == 2
    before = lm.kv_stats["computed_tokens"]
    check(adapters["b"][1], prompt + [40], lm.next_token_logprobs_sync(prompt + [40]))
    assert lm.kv_stats["computed_tokens"] - before == len(prompt) + 1
    lm.remove_lora("b")
    check(adapters["b"][1], prompt + [41], lm.next_token_logprobs_sync(prompt + [41]))
    lm.remove_lora("a")
    assert lm.loaded_loras == () and not isinstance(lm.model, peft.PeftModel)
    check(base_model, prompt, lm.next_token_logprobs_sync(prompt))


def test_a_closed_model_lists_no_adapter_and_its_adapter_calls_raise(lm, adapters):
    """After close no adapter is listed or active (both were, and set_lora and clear_lora
    still changed the active one), and the adapter calls raise ModelClosedError."""
    from genlm.core import ModelClosedError

    lm.set_lora("a")
    lm.close()
    assert lm.loaded_loras == () and lm.active_lora is None
    calls = [
        lambda: lm.set_lora("b"),
        lm.clear_lora,
        lambda: lm.remove_lora("a"),
        lambda: lm.add_lora(adapters["a"][0], "c"),
    ]
    for call in calls:
        with pytest.raises(ModelClosedError, match="is closed"):
            call()
