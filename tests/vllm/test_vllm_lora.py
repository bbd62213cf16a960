"""LoRA adapters through vLLM's LoRARequest, checked against weights merged by hand."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from .conftest import (
    hold_steps,
    merge_adapter,
    rows_during_a_generation,
    save_adapter,
    unfinished_at_row_admissions,
)
from .test_vllm_logprobs import distinct_contexts

torch = pytest.importorskip("torch")


def test_lora_rows_match_merged_weights_and_cache_is_per_adapter(
    vllm_lm, adapter, merged_model, expected
):
    """With an adapter set, rows equal the merged model's; the output cache keeps adapters apart."""
    path, _ = adapter
    vllm_lm.clear_cache()
    contexts = [[50256, 464, 3290], [50256] + list(range(1000, 1040))]
    vllm_lm.add_lora(path, "random")
    try:
        base = asyncio.run(vllm_lm.batch_next_token_logprobs(contexts))
        vllm_lm.set_lora("random")
        adapted = asyncio.run(vllm_lm.batch_next_token_logprobs(contexts))
        vllm_lm.clear_lora()
        base_again = asyncio.run(vllm_lm.batch_next_token_logprobs(contexts))
    finally:
        vllm_lm.clear_lora()
    for context, b, a, b2 in zip(contexts, base, adapted, base_again):
        np.testing.assert_allclose(b, expected(context), atol=1e-4)
        np.testing.assert_allclose(a, expected(context, model=merged_model), atol=1e-4)
        assert np.abs(a - b).max() > 0.1  # the adapter really changes the distribution
        np.testing.assert_array_equal(b2, b)


def test_unknown_adapter_names_the_registered_ones(vllm_lm):
    """set_lora with an unregistered name fails with the known names."""
    with pytest.raises(KeyError, match="no LoRA adapter named 'nope'"):
        vllm_lm.set_lora("nope")


@pytest.fixture
def registered(vllm_lm, adapter):
    """The adapter registered as "random" (the model is shared by the module's tests)."""
    try:
        vllm_lm.add_lora(adapter[0], "random")
    except ValueError:  # registered by an earlier test of this module
        pass
    return "random"


def test_a_request_names_its_adapter_with_variant(vllm_lm, registered, merged_model, expected):
    """``variant=`` picks a registered adapter for one request, as hf's does, leaving the
    model's own adapter alone; an unregistered name fails with the registered ones."""
    context = [50256, 464, 3291]
    adapted = vllm_lm.next_token_logprobs_sync(context, variant="random")
    base = vllm_lm.next_token_logprobs_sync(context)
    np.testing.assert_allclose(adapted, expected(context, model=merged_model), atol=1e-4)
    np.testing.assert_allclose(base, expected(context), atol=1e-4)
    with pytest.raises(KeyError, match="'nope'.*'random'"):
        vllm_lm.next_token_logprobs_sync(context, variant="nope")


def test_sample_draws_under_its_variant(vllm_lm, registered, merged_model, expected):
    """``sample``/``batch_sample(variant=)`` draw every step under that adapter: vLLM's own
    greedy run follows the merged model's argmax, and core's seeded sampler draws what it
    draws with the adapter set; an unregistered name fails before any work."""
    prompt = [50256, 464, 3290]
    context, greedy = list(prompt), []
    for _ in range(4):
        greedy.append(int(np.argmax(expected(context, model=merged_model))))
        context.append(greedy[-1])
    assert asyncio.run(vllm_lm.sample(prompt, 4, [], temperature=0, variant="random")) == greedy
    batch = asyncio.run(vllm_lm.batch_sample([prompt], 4, [], temperature=0, variant="random"))
    assert batch == [greedy]
    seeded = asyncio.run(vllm_lm.sample(prompt, 4, [], seed=1, variant="random"))
    vllm_lm.set_lora("random")
    try:
        assert asyncio.run(vllm_lm.sample(prompt, 4, [], seed=1)) == seeded
    finally:
        vllm_lm.clear_lora()
    for seed in (None, 1):
        with pytest.raises(KeyError, match="'nope'"):
            asyncio.run(vllm_lm.sample(prompt, 2, [], seed=seed, variant="nope"))


def test_gathered_samples_of_different_variants_run_one_engine_run_each(
    vllm_lm, registered, hf_model, merged_model, expected, runs
):
    """Unseeded samples gathered with different adapters run one engine run per adapter,
    the oldest first, and each draws under its own: greedy, each follows its model's argmax
    (the merged weights', the base's). One run would be wrong on CPU: vLLM's CPU LoRA
    kernels apply the loaded adapter to a base-model request stepped beside an adapter's
    (vllm-project/vllm#48421)."""

    def argmax_run(prompt, model):
        context, greedy = list(prompt), []
        for _ in range(3):
            greedy.append(int(np.argmax(expected(context, model=model))))
            context.append(greedy[-1])
        return greedy

    prompt = [50256, 464, 3292]

    async def together():
        return await asyncio.gather(
            vllm_lm.sample(prompt, 3, [], temperature=0, variant="random"),
            vllm_lm.sample(prompt, 3, [], temperature=0, variant=None),
            vllm_lm.batch_sample([prompt], 3, [], temperature=0, variant="random"),
        )

    adapted, base, batch = asyncio.run(together())
    assert [len(keys) for keys in runs] == [2, 1]
    assert adapted == argmax_run(prompt, merged_model) == batch[0]
    assert base == argmax_run(prompt, hf_model)


def test_adapters_added_from_several_threads_get_distinct_ids(vllm_lm, adapter, monkeypatch):
    """``add_lora`` from threads at once: every adapter gets its own vLLM id and a name is
    registered once (the id was the count read without a lock, so two adapters could share
    an id, and vLLM would serve one's weights for the other). The window between reading
    the count and storing the adapter is widened by a slow ``LoRARequest``."""
    import threading
    import time

    import vllm.lora.request

    made = vllm.lora.request.LoRARequest

    def slow(*args, **kwargs):
        time.sleep(0.005)
        return made(*args, **kwargs)

    monkeypatch.setattr(vllm.lora.request, "LoRARequest", slow)
    before = len(vllm_lm._served_variants())
    threads, per_thread = 4, 3
    barrier = threading.Barrier(threads)
    outcomes = []

    def add(t: int) -> None:
        barrier.wait()
        for k in range(per_thread):
            vllm_lm.add_lora(adapter[0], f"thread{t}-{k}")
        try:
            vllm_lm.add_lora(adapter[0], "everyone")
            outcomes.append("added")
        except ValueError:
            outcomes.append("refused")

    workers = [threading.Thread(target=add, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert sorted(outcomes) == ["added"] + ["refused"] * (threads - 1)
    ids = [vllm_lm._lora_request(name).lora_int_id for name in vllm_lm._served_variants()]
    assert len(ids) == before + threads * per_thread + 1
    assert len(set(ids)) == len(ids)


def test_rows_of_another_adapter_wait_for_a_generation_to_end(
    vllm_lm, registered, merged_model, expected, monkeypatch
):
    """vLLM's CPU LoRA kernels apply the loaded adapter to a base-model request stepped
    beside an adapter's (vllm-project/vllm#48421): base rows asked for while an adapter's
    generation runs are added once the generation has ended (the engine holds nothing
    else then) and equal transformers' base rows; the generation draws all its tokens."""
    engine = vllm_lm.llm.llm_engine
    vllm_lm.clear_cache()
    gate = hold_steps(engine, monkeypatch)
    beside = unfinished_at_row_admissions(engine, monkeypatch)
    prompt, *contexts = distinct_contexts(3, seed=14)
    generation = vllm_lm.sample(prompt, 40, [], temperature=1.0, variant=registered)
    rows, _, tokens = asyncio.run(rows_during_a_generation(vllm_lm, gate, contexts, generation))
    assert len(tokens) == 40 and len(beside) == 2 and beside[0] == 0
    for context, row in zip(contexts, rows):
        np.testing.assert_allclose(row, expected(context), atol=1e-4)


@pytest.fixture(scope="module")
def second_adapter(tmp_path_factory, hf_model):
    """Another adapter of the same shape (other random weights), and its merged model."""
    out = tmp_path_factory.mktemp("lora-second")
    return out, merge_adapter(hf_model, save_adapter(out, hf_model, seed=1))


def test_an_adapter_removed_then_registered_again_serves_its_new_weights(
    vllm_lm, adapter, merged_model, second_adapter, expected
):
    """``remove_lora`` unregisters an adapter: a request for it queued before the removal
    fails with UnknownVariantError, as does one made after; the name registered again with
    other weights serves those, also for a context whose prefix ran under the removed one
    (vLLM 0.27 keys its prefix cache by the adapter's name alone: had the engine seen the
    same name twice, the new adapter would read the removed one's KV)."""
    from genlm.core import UnknownVariantError

    second_path, second_merged = second_adapter
    context = [50256] + list(range(2000, 2299))  # 300 tokens: full KV blocks (128 on CPU)
    longer = context + [464]
    vllm_lm.add_lora(adapter[0], "swap")
    first = vllm_lm.next_token_logprobs_sync(context, variant="swap")
    np.testing.assert_allclose(first, expected(context, model=merged_model), atol=1e-4)

    async def removed_while_queued():
        queued = asyncio.ensure_future(vllm_lm.next_token_logprobs(longer, variant="swap"))
        await asyncio.sleep(0)  # queued; its batch's flush is scheduled, not yet run
        vllm_lm.remove_lora("swap")
        with pytest.raises(UnknownVariantError, match="'swap' was removed"):
            await queued

    asyncio.run(removed_while_queued())
    assert "swap" not in vllm_lm.loaded_loras
    with pytest.raises(UnknownVariantError, match="'swap'"):
        vllm_lm.next_token_logprobs_sync(context, variant="swap")

    vllm_lm.add_lora(second_path, "swap")
    try:
        again = vllm_lm.next_token_logprobs_sync(longer, variant="swap")
        np.testing.assert_allclose(again, expected(longer, model=second_merged), atol=1e-4)
        assert np.abs(again - expected(longer, model=merged_model)).max() > 0.1
    finally:
        vllm_lm.remove_lora("swap")
    with pytest.raises(UnknownVariantError, match="'swap'"):
        vllm_lm.remove_lora("swap")
    vllm_lm.add_lora(adapter[0], "never used")  # loaded, never run
    vllm_lm.remove_lora("never used")
    assert "never used" not in vllm_lm.loaded_loras


def test_a_generation_waiting_when_its_adapter_is_removed_fails_or_draws_under_the_new_one(
    vllm_lm, adapter, merged_model, second_adapter, expected
):
    """An unseeded ``sample`` made before its adapter is removed, its run not yet started,
    fails with UnknownVariantError, as a row request does; if the name is registered again
    first, it draws under the new adapter (greedy: the second merged model's argmax), not
    the removed one's (it looked the adapter up when it was made, and vLLM loaded the
    removed weights back for it)."""
    from genlm.core import UnknownVariantError

    prompt = [50256, 464, 3290]

    async def sample_then(change):
        vllm_lm.add_lora(adapter[0], "gone")
        queued = asyncio.ensure_future(vllm_lm.sample(prompt, 3, [], temperature=0, variant="gone"))
        await asyncio.sleep(0)  # queued; its run's flush is scheduled, not yet run
        vllm_lm.remove_lora("gone")
        change()
        return await queued

    with pytest.raises(UnknownVariantError, match="'gone' was removed"):
        asyncio.run(sample_then(lambda: None))
    try:
        greedy = asyncio.run(sample_then(lambda: vllm_lm.add_lora(second_adapter[0], "gone")))
    finally:
        vllm_lm.remove_lora("gone")
    context, expected_greedy = list(prompt), []
    for _ in range(3):
        expected_greedy.append(int(np.argmax(expected(context, model=second_adapter[1]))))
        context.append(expected_greedy[-1])
    assert greedy == expected_greedy
    first_adapter = [int(np.argmax(expected(prompt, model=merged_model)))]
    assert greedy[:1] != first_adapter  # the two adapters draw apart here


def test_the_facade_loads_replaces_selects_and_removes_adapters(
    vllm_lm, adapter, merged_model, second_adapter, expected
):
    """genlm.backend's ``AsyncVirtualLM`` takes genlm-backend 0.3.1's adapter calls:
    ``add_new_lora`` (under a loaded name it replaces the adapter), ``lora_name=`` per call,
    ``set_lora``/``clear_lora``, ``remove_lora``; rows as the merged models give them."""
    from genlm.backend.llm import AsyncVirtualLM

    facade = AsyncVirtualLM(vllm_lm)
    second_path, second_merged = second_adapter
    context = [50256, 464, 3295, 318]
    facade.add_new_lora(str(second_path), "facade")
    try:
        row = asyncio.run(facade.next_token_logprobs(context, lora_name="facade"))
        np.testing.assert_allclose(row.numpy(), expected(context, model=second_merged), atol=1e-4)
        facade.add_new_lora(str(adapter[0]), "facade")  # replaced
        facade.set_lora(lora_name="facade")
        row = asyncio.run(facade.next_token_logprobs(context))
        np.testing.assert_allclose(row.numpy(), expected(context, model=merged_model), atol=1e-4)
        facade.clear_lora()
        row = asyncio.run(facade.next_token_logprobs(context))
        np.testing.assert_allclose(row.numpy(), expected(context), atol=1e-4)
    finally:
        facade.remove_lora("facade")
    assert "facade" not in vllm_lm.loaded_loras


def test_replacing_an_adapter_keeps_it_until_the_new_one_has_loaded(
    vllm_lm, adapter, merged_model, second_adapter, expected, tmp_path, monkeypatch
):
    """``add_lora(..., replace=True)``: the engine loads the new adapter first, so a path
    without one fails at once and the name keeps serving its adapter (the facade's
    add_new_lora dropped it first, and vLLM failed the path only at a request); the
    second adapter then takes the name, its rows are the second merged model's, and the
    engine no longer holds the first."""
    from vllm.exceptions import LoRAAdapterNotFoundError

    engine = vllm_lm.llm.llm_engine
    context = [50256, 464, 3296]
    released, release = [], vllm_lm._release_adapter

    def recorded(name, value):
        released.append((name, value.lora_int_id))
        return release(name, value)

    monkeypatch.setattr(vllm_lm, "_release_adapter", recorded)
    vllm_lm.add_lora(adapter[0], "kept")
    try:
        first = vllm_lm._lora_request("kept").lora_int_id
        with pytest.raises(LoRAAdapterNotFoundError):
            vllm_lm.add_lora(tmp_path / "nowhere", "kept", replace=True)
        assert "kept" in vllm_lm.loaded_loras
        vllm_lm.clear_cache()
        row = vllm_lm.next_token_logprobs_sync(context, variant="kept")
        np.testing.assert_allclose(row, expected(context, model=merged_model), atol=1e-4)
        assert released == []
        vllm_lm.add_lora(second_adapter[0], "kept", replace=True)
        # released by the replacement (the engine's one-adapter cache would also evict it)
        assert released == [("kept", first)] and first not in engine.list_loras()
        row = vllm_lm.next_token_logprobs_sync(context, variant="kept")
        np.testing.assert_allclose(row, expected(context, model=second_adapter[1]), atol=1e-4)
    finally:
        vllm_lm.remove_lora("kept")


def test_a_release_whose_first_step_fails_still_frees_the_adapter(vllm_lm, adapter, monkeypatch):
    """remove_lora whose first release step fails (stepping a generation that made way to
    its end: an engine step raising) still removes the adapter's weights from the engine,
    then raises that failure; the name is gone. The engine kept the weights: the steps
    after the failing one were skipped."""
    engine = vllm_lm.llm.llm_engine
    vllm_lm.add_lora(adapter[0], "half")
    lora_id = vllm_lm._lora_request("half").lora_int_id
    vllm_lm.next_token_logprobs_sync([50256, 464, 3297], variant="half")
    assert lora_id in engine.list_loras()

    def broken_step() -> None:
        raise RuntimeError("an engine step failed")

    monkeypatch.setattr(vllm_lm, "_finish_others", broken_step)
    with pytest.raises(RuntimeError, match="an engine step failed"):
        vllm_lm.remove_lora("half")
    monkeypatch.undo()
    assert "half" not in vllm_lm.loaded_loras
    assert lora_id not in engine.list_loras()
