"""genlm.backend.llm: documented classes, torch rows equal to independent forwards, sampling."""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import pytest
import torch
import transformers

from genlm.backend.llm import (
    AsyncLM,
    AsyncMlxLM,
    AsyncTransformer,
    AsyncVirtualLM,
    MockAsyncLM,
    load_model_by_name,
)
from genlm.backend.tokenization import Token, decode_vocab
from genlm.backend.trie import TokenCharacterTrie
from genlm.core.backend import sample_token
from genlm.core.mock import MockLM, mock_logprobs

CONTEXTS = [[1, 403, 407, 261, 378], [1, 20, 30], [1, 403, 407]]


def test_classes_are_real_subclasses_of_async_lm():
    for cls in (AsyncTransformer, AsyncVirtualLM, AsyncMlxLM, MockAsyncLM):
        assert issubclass(cls, AsyncLM)
    with pytest.raises(TypeError):
        AsyncLM(None)  # abstract


def test_rows_are_float32_tensors_equal_to_a_plain_forward(hf_llm, reference):
    assert isinstance(hf_llm, AsyncTransformer)
    V = len(hf_llm.byte_vocab)
    row = hf_llm.next_token_logprobs_sync(CONTEXTS[0])
    assert isinstance(row, torch.Tensor) and row.dtype == torch.float32 and row.shape == (V,)
    assert row.device == hf_llm.device
    torch.testing.assert_close(row.double(), reference(CONTEXTS[0]), atol=5e-5, rtol=0)

    async def run():
        return await asyncio.gather(
            hf_llm.batch_next_token_logprobs(CONTEXTS),
            *(hf_llm.next_token_logprobs(c) for c in CONTEXTS),
        )

    batch, *singles = asyncio.run(run())
    assert batch.shape == (len(CONTEXTS), V) and batch.dtype == torch.float32
    for context, b, s in zip(CONTEXTS, batch, singles):
        torch.testing.assert_close(b.double(), reference(context), atol=5e-5, rtol=0)
        torch.testing.assert_close(b, s, atol=0, rtol=0)
    sync_batch = hf_llm.batch_next_token_logprobs_sync(CONTEXTS)
    torch.testing.assert_close(sync_batch, batch, atol=0, rtol=0)
    uncached = hf_llm.next_token_logprobs_uncached(CONTEXTS[1])
    torch.testing.assert_close(uncached.double(), reference(CONTEXTS[1]), atol=5e-5, rtol=0)


def test_rows_equal_the_wrapped_core_models_rows(hf_llm):
    """The facade adds no computation: its rows are core_lm's rows, as tensors."""
    core_rows = hf_llm.core_lm.batch_next_token_logprobs_sync(CONTEXTS)
    assert isinstance(core_rows, np.ndarray)
    np.testing.assert_array_equal(
        hf_llm.batch_next_token_logprobs_sync(CONTEXTS).numpy(), core_rows
    )


def test_byte_vocab_holds_tokens_of_the_core_vocabulary(hf_llm):
    tokens = hf_llm.core_lm.vocab.tokens
    assert len(hf_llm.byte_vocab) == len(tokens) == len(hf_llm.str_vocab)
    for i, token in enumerate(hf_llm.byte_vocab):
        assert isinstance(token, Token) and token.token_id == i and token.byte_string == tokens[i]
    space = hf_llm.tokenizer.convert_tokens_to_ids("▁the")
    assert hf_llm.byte_vocab[space] == b" the" and hf_llm.str_vocab[space] == " the"


def test_a_model_padded_beyond_its_tokenizer_lists_the_tokenizers_tokens():
    """A model with 600 logits for its 512 tokens (Qwen2 and Phi-3 checkpoints are padded so):
    ``byte_vocab``/``str_vocab`` are ``decode_vocab(tokenizer)``'s 512 entries, as 0.3.1's
    are (genlm-control slices rows to their length); rows keep the model's 600 logits,
    normalized over all of them; ``vocab`` (core's, as wide as the rows) holds the padding
    as unused ids. A trie of ``byte_vocab`` reads the wider rows up to its length, as
    0.3.1's did (it refused them), and refuses narrower ones, naming both widths."""
    import transformers

    from genlm.core.backend import resolve_model_path

    path = resolve_model_path("stories260K")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path).double().eval()
    model.resize_token_embeddings(600)
    with torch.no_grad():
        model.get_output_embeddings().weight[512:] = 0.5
    llm = AsyncTransformer(model, tok)
    try:
        byte_vocab, str_vocab = decode_vocab(tok)
        assert len(byte_vocab) == 512
        assert llm.byte_vocab == byte_vocab and llm.str_vocab == str_vocab
        assert [t.token_id for t in llm.byte_vocab] == list(range(512))
        assert len(llm.vocab) == 600 and llm.vocab.unused_ids >= set(range(512, 600))
        context = CONTEXTS[2]
        row = llm.next_token_logprobs_sync(context)
        with torch.inference_mode():
            logits = model(torch.tensor([context])).logits[0, -1]
        torch.testing.assert_close(row.double(), torch.log_softmax(logits, -1), atol=1e-6, rtol=0)
        trie = TokenCharacterTrie(decode=llm.byte_vocab)
        masses = trie.weight_sum(row.exp())
        np.testing.assert_array_equal(masses, trie.weight_sum(row[:512].exp()))
        batch = trie.batch_weight_sum(torch.stack([row, row]).exp())
        np.testing.assert_array_equal(batch, np.stack([masses, masses]))
        with pytest.raises(ValueError, match=r"\(500,\) do not match a vocabulary of 512"):
            trie.weight_sum(row[:500].exp())
    finally:
        llm.close()


def test_cache_management_keeps_results(hf_llm, reference):
    prompt = CONTEXTS[0]
    hf_llm.cache_kv(prompt)
    before = hf_llm.core_lm.kv_stats["computed_tokens"]
    row = hf_llm.next_token_logprobs_sync(prompt + [40])
    assert hf_llm.core_lm.kv_stats["computed_tokens"] - before == 1  # the pinned prompt is reused
    torch.testing.assert_close(row.double(), reference(prompt + [40]), atol=5e-5, rtol=0)
    hf_llm.clear_cache()
    hf_llm.clear_kv_cache()
    hf_llm.reset_async_queries()
    assert len(hf_llm.core_lm.output_cache) == 0 and hf_llm.core_lm.kv.nbytes == 0
    again = hf_llm.next_token_logprobs_sync(prompt + [40])
    torch.testing.assert_close(again, row, atol=5e-5, rtol=0)


def test_sample_stops_before_eos_and_is_seeded(hf_llm):
    prompt = CONTEXTS[2]
    probe = hf_llm.next_token_logprobs_sync(prompt)
    likely = int(probe.argmax())  # make the most likely first token an "EOS"
    draws = [
        asyncio.run(hf_llm.sample(prompt, max_tokens=5, eos_token_ids=[likely], seed=s))
        for s in range(8)
    ]
    assert all(likely not in d and len(d) <= 5 for d in draws)
    assert any(len(d) < 5 for d in draws)  # some draw met the EOS, which is not returned
    same = asyncio.run(hf_llm.sample(prompt, max_tokens=5, eos_token_ids=[likely], seed=3))
    assert same == draws[3]
    greedy = asyncio.run(hf_llm.sample(prompt, max_tokens=3, eos_token_ids=[], temperature=0))
    assert greedy[0] == likely and len(greedy) == 3
    batch = asyncio.run(hf_llm.batch_sample([prompt, prompt], 4, [likely], seed=7))
    assert batch[0] == batch[1]  # the documented batch_sample gives every prompt the seed


def test_lora_name_errors_name_the_problem(hf_llm):
    with pytest.raises(KeyError, match="nope"):
        hf_llm.next_token_logprobs_sync(CONTEXTS[0], lora_name="nope")
    with pytest.raises(ValueError):
        hf_llm.next_token_logprobs_sync([])


def test_mock_async_lm_rows_are_core_mock_rows():
    mock = MockAsyncLM.from_name("stories260K")
    assert isinstance(mock, MockAsyncLM)
    V = len(mock.byte_vocab)
    row = mock.next_token_logprobs_sync(CONTEXTS[1])
    assert row.dtype == torch.float32 and row.shape == (V,)
    np.testing.assert_array_equal(row.numpy(), mock_logprobs(CONTEXTS[1], V).astype(np.float32))
    with pytest.raises(ValueError, match="no variants"):
        mock.next_token_logprobs_sync(CONTEXTS[1], lora_name="a")
    mock.close()


@pytest.mark.parametrize(
    ("call", "method"),
    [
        (lambda llm: llm.add_new_lora("/nowhere", "a"), "add_lora"),
        (lambda llm: llm.remove_lora("a"), "remove_lora"),
        (lambda llm: llm.set_lora(lora_name="a"), "set_lora"),
        (lambda llm: llm.clear_lora(), "clear_lora"),
    ],
)
def test_adapter_calls_on_a_model_without_adapters_name_what_is_missing(call, method):
    """The facade's adapter calls go to the core model's; where it has none (the mock),
    the error names the facade, the core model and the missing method."""
    mock = MockAsyncLM.from_name("stories260K")
    try:
        with pytest.raises(NotImplementedError, match=f"MockAsyncLM over MockLM .*\\({method}\\)"):
            call(mock)
    finally:
        mock.close()


def test_core_smc_runs_on_a_facade_model_as_on_its_core_model():
    # A facade model's rows are torch tensors by default; core's smc asks for numpy by name.
    from genlm.core.smc import smc

    mock = MockAsyncLM.from_name("stories260K")
    args = dict(n_particles=4, max_tokens=5, seed=3)
    on_facade = asyncio.run(smc(mock, CONTEXTS[1], **args))
    on_core = asyncio.run(smc(mock.core_lm, CONTEXTS[1], **args))
    assert [p.tokens for p in on_facade.particles] == [p.tokens for p in on_core.particles]
    assert on_facade.log_marginal == on_core.log_marginal
    mock.close()


def test_load_model_by_name_rejects_unknown_backends_and_engines():
    with pytest.raises(ValueError, match="Invalid backend"):
        load_model_by_name("stories260K", backend="tpu")
    assert isinstance(load_model_by_name("stories260K", backend="mock"), MockAsyncLM)
    with pytest.raises(TypeError, match="from_name"):
        AsyncVirtualLM(object())


def test_constructor_maps_batch_size_and_timeout():
    import transformers

    from genlm.core.backend import resolve_model_path

    path = resolve_model_path("stories260K")
    llm = AsyncTransformer(
        transformers.AutoModelForCausalLM.from_pretrained(path),
        transformers.AutoTokenizer.from_pretrained(path),
        batch_size=3,
        timeout=0.5,
    )
    assert llm.core_lm.batcher.max_batch_size == 3 and llm.core_lm.batcher.max_wait_s == 0.5
    llm.close()


def with_random_adapter(tmp_path) -> AsyncTransformer:
    """An AsyncTransformer over stories260K with a random LoRA adapter "a" (saved under
    ``tmp_path``) loaded, the base model current."""
    peft = pytest.importorskip("peft")
    import transformers

    from genlm.core.backend import resolve_model_path

    path = resolve_model_path("stories260K")
    torch.manual_seed(0)
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft.get_peft_model(
        transformers.AutoModelForCausalLM.from_pretrained(path), config
    ).save_pretrained(tmp_path)
    llm = AsyncTransformer(
        transformers.AutoModelForCausalLM.from_pretrained(path),
        transformers.AutoTokenizer.from_pretrained(path),
    )
    llm.add_new_lora(str(tmp_path), "a")
    return llm


def test_lora_name_selects_the_adapter_per_call(tmp_path):
    """``lora_name=`` rows equal the core model's rows under that variant, and differ from the
    base model's; concurrent calls under both batch without switching the model's state."""
    llm = with_random_adapter(tmp_path)

    async def run():
        return await asyncio.gather(
            llm.next_token_logprobs(CONTEXTS[0], lora_name="a"),
            llm.next_token_logprobs(CONTEXTS[0]),
            llm.batch_next_token_logprobs(CONTEXTS[:2], lora_name="a"),
        )

    adapted, base, batch = asyncio.run(run())
    core = llm.core_lm
    np.testing.assert_array_equal(
        adapted.numpy(), core.next_token_logprobs_sync(CONTEXTS[0], variant="a")
    )
    np.testing.assert_array_equal(
        base.numpy(), core.next_token_logprobs_sync(CONTEXTS[0], variant=None)
    )
    np.testing.assert_array_equal(batch[0].numpy(), adapted.numpy())
    assert (adapted - base).abs().max() > 1e-3  # the adapter changes the distribution
    llm.set_lora(str(tmp_path), "a")  # loaded already: selected, not loaded twice
    llm.set_lora(str(tmp_path), "b")  # not loaded yet: loaded, then selected
    assert core.loaded_loras == ("a", "b") and core.active_lora == "b"
    llm.close()


def test_lora_management_follows_0_3_1(tmp_path):
    """As in genlm-backend 0.3.1: add_new_lora under a loaded name replaces the adapter,
    remove_lora unloads one, cache_kv takes lora_name, and an unknown lora_name is a
    ValueError (also a KeyError, GenLM's documented error)."""
    peft = pytest.importorskip("peft")
    import transformers

    from genlm.core.backend import resolve_model_path

    path = resolve_model_path("stories260K")
    saved = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        saved.append(tmp_path / f"lora{seed}")
        peft.get_peft_model(
            transformers.AutoModelForCausalLM.from_pretrained(path), config
        ).save_pretrained(saved[-1])
    llm = AsyncTransformer(
        transformers.AutoModelForCausalLM.from_pretrained(path),
        transformers.AutoTokenizer.from_pretrained(path),
    )
    core = llm.core_lm
    try:
        llm.add_new_lora(str(saved[0]), "x")
        llm.add_new_lora(str(saved[1]), "y")
        first = llm.next_token_logprobs_sync(CONTEXTS[0], lora_name="x")
        other = llm.next_token_logprobs_sync(CONTEXTS[0], lora_name="y")
        llm.add_new_lora(str(saved[1]), "x")  # replaced: x now has y's weights
        assert core.loaded_loras == ("y", "x")
        replaced = llm.next_token_logprobs_sync(CONTEXTS[0], lora_name="x")
        assert (replaced - first).abs().max() > 1e-3
        torch.testing.assert_close(replaced, other, atol=1e-6, rtol=0)
        before = core.kv_stats["computed_tokens"]
        llm.cache_kv(CONTEXTS[1], lora_name="y")
        llm.next_token_logprobs_sync(CONTEXTS[1] + [5], lora_name="y")
        assert core.kv_stats["computed_tokens"] - before == len(CONTEXTS[1]) + 1
        llm.remove_lora("y")
        assert core.loaded_loras == ("x",)
        for bad in (KeyError, ValueError):
            with pytest.raises(bad, match="'y'"):
                llm.next_token_logprobs_sync(CONTEXTS[0], lora_name="y")
    finally:
        llm.close()


def test_add_new_lora_over_a_loaded_name_keeps_it_when_the_new_one_fails(tmp_path):
    """add_new_lora under a loaded name whose new adapter fails to load (no adapter at the
    path; an adapter of a wider model) raises and leaves the loaded one current and
    serving the rows it served (the facade removed it first, as genlm-backend 0.3.1's hf
    class does, so the name was gone); one that loads replaces it, still current."""
    peft = pytest.importorskip("peft")
    import transformers

    from genlm.core.backend import resolve_model_path

    path = resolve_model_path("stories260K")
    config = transformers.AutoConfig.from_pretrained(path)
    config.hidden_size *= 2
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    torch.manual_seed(2)
    wider = transformers.AutoModelForCausalLM.from_config(config)
    peft.get_peft_model(wider, lora).save_pretrained(tmp_path / "wider")
    llm = with_random_adapter(tmp_path / "a")
    core = llm.core_lm
    try:
        base = llm.next_token_logprobs_sync(CONTEXTS[0])
        llm.set_lora(lora_name="a")
        served = llm.next_token_logprobs_sync(CONTEXTS[0])
        assert (served - base).abs().max() > 1e-3
        for bad, error in ((tmp_path / "nowhere", ValueError), (tmp_path / "wider", RuntimeError)):
            with pytest.raises(error):
                llm.add_new_lora(str(bad), "a")
            assert core.loaded_loras == ("a",) and core.active_lora == "a"
            llm.clear_cache()  # the row computed again, not the cached one
            torch.testing.assert_close(
                llm.next_token_logprobs_sync(CONTEXTS[0]), served, atol=1e-6, rtol=0
            )
        llm.add_new_lora(str(tmp_path / "a"), "a")  # the same weights again: the same rows
        assert core.loaded_loras == ("a",) and core.active_lora == "a"
        torch.testing.assert_close(
            llm.next_token_logprobs_sync(CONTEXTS[0]), served, atol=1e-6, rtol=0
        )
    finally:
        llm.close()


class RowsOf(AsyncLM):
    """A user's AsyncLM subclass: the base class samples over its torch rows."""

    def __init__(self, core_lm):
        self.core_lm = core_lm

    async def next_token_logprobs(self, token_ids):
        return await self.core_lm.next_token_logprobs(token_ids, output="torch")

    def next_token_logprobs_sync(self, token_ids):
        return self.core_lm.next_token_logprobs_sync(token_ids, output="torch")


def test_async_lm_base_class_samples_with_cores_sampler():
    """The base class's draws are core's: the same tokens as core's sample on the same rows
    and seed (core's keeps the EOS token that ended the draw, the facade drops it)."""
    from genlm.core import Vocabulary
    from genlm.core.mock import MockLM

    vocab = Vocabulary([bytes([i]) for i in range(16)], eos_token_ids=(3,))
    core = MockLM(vocab)
    lm = RowsOf(core)
    for seed in range(6):
        for temperature in (1.0, 0.5, 0.0):
            mine = asyncio.run(lm.sample([1, 2], 8, [3], temperature=temperature, seed=seed))
            core_draw = asyncio.run(core.sample([1, 2], 8, [3], temperature, seed))
            assert mine == [t for t in core_draw if t != 3]
    with pytest.raises(ValueError, match="temperature"):
        asyncio.run(lm.sample([1, 2], 3, [3], temperature=-1.0))
    for bad, error in ((-(2**63) - 1, ValueError), (1.5, TypeError), ("7", TypeError)):
        with pytest.raises(error, match="seed must be None or a non-negative integer"):
            asyncio.run(lm.sample([1, 2], 3, [3], seed=bad))
    # A negative seed is torch's (0.3.1 seeded torch): its two's complement.
    for seed in (-1, -(2**63), -12345):
        assert asyncio.run(lm.sample([1, 2], 8, [3], seed=seed)) == asyncio.run(
            lm.sample([1, 2], 8, [3], seed=seed + 2**64)
        )
    core.close()


class RowsAs(RowsOf):
    """A subclass whose rows come in another form: a bf16 model's own dtype, or a
    ``(1, V)`` batch of one (0.3.1's sampler took both)."""

    def __init__(self, core_lm, form):
        super().__init__(core_lm)
        self.form = form

    async def next_token_logprobs(self, token_ids):
        return self.form(await super().next_token_logprobs(token_ids))

    def next_token_logprobs_sync(self, token_ids):
        return self.form(super().next_token_logprobs_sync(token_ids))


@pytest.mark.parametrize(
    "form",
    [lambda row: row.to(torch.bfloat16), lambda row: row[None]],
    ids=["bfloat16", "one-row-batch"],
)
def test_the_base_class_samples_rows_of_another_form(form):
    """bf16 rows (numpy has none) and ``(1, V)`` rows are drawn from, as 0.3.1 did: the
    same tokens as core's sampler over those rows widened to float64, step by step."""
    from genlm.core import Vocabulary
    from genlm.core.mock import MockLM

    core = MockLM(Vocabulary([bytes([i]) for i in range(16)], eos_token_ids=(3,)))
    lm = RowsAs(core, form)
    for seed in range(4):
        drawn = asyncio.run(lm.sample([1, 2], 6, [3], temperature=0.7, seed=seed))

        def row(context):
            row = form(torch.from_numpy(mock_logprobs(context, 16).astype(np.float32)))
            return row.to(torch.float64).numpy().reshape(-1)

        assert drawn == core_draw(row, [1, 2], 6, seed, 0.7)
    core.close()


def core_draw(row, prompt, max_tokens, seed, temperature=1.0, eos=3) -> list[int]:
    """The tokens core's sampler draws, step by step, from ``row(context)`` after
    ``prompt`` (the facade's ``sample`` with ``seed``: EOS ``eos`` ends it, dropped)."""
    rng, context, drawn = np.random.default_rng(seed), list(prompt), []
    for _ in range(max_tokens):
        token = sample_token(row(context), rng, temperature)
        if token == eos:
            break
        drawn.append(token)
        context.append(token)
    return drawn


class RowsUnder(RowsOf):
    """A user's subclass with adapters, as genlm-backend 0.3.1's base class calls it: the
    rows of the core model under ``lora_name`` (a core variant)."""

    def __init__(self, core_lm):
        super().__init__(core_lm)
        self.asked: list[str | None] = []

    async def next_token_logprobs(self, token_ids, lora_name=None):
        self.asked.append(lora_name)
        return await self.core_lm.next_token_logprobs(token_ids, variant=lora_name, output="torch")

    def next_token_logprobs_sync(self, token_ids, lora_name=None):
        self.asked.append(lora_name)
        return self.core_lm.next_token_logprobs_sync(token_ids, variant=lora_name, output="torch")


class TwoVariants(MockLM):
    """A mock with one adapter, "a", whose rows are those of another seed."""

    def _served_variants(self):
        return ("a",)

    def _logprobs_batch(self, contexts, variant):
        seed = 1 if variant == "a" else 0
        return np.stack([mock_logprobs(c, len(self.vocab), seed) for c in contexts])


def test_async_lm_base_class_takes_lora_name_as_0_3_1_does():
    """genlm-control's PromptedLLM passes lora_name= to every call: the base class's batch
    methods, sample and batch_sample take it and pass it on when it names an adapter (a
    subclass without adapters, written to the documented API, is never given it)."""
    from genlm.core import Vocabulary

    vocab = Vocabulary([bytes([i]) for i in range(16)], eos_token_ids=(3,))
    core = TwoVariants(vocab)
    plain, adapted = RowsOf(core), RowsUnder(core)
    contexts = [[1, 2], [1, 2, 5]]
    rows = plain.batch_next_token_logprobs_sync(contexts, lora_name=None)
    np.testing.assert_array_equal(rows.numpy(), core.batch_next_token_logprobs_sync(contexts))
    rows = asyncio.run(adapted.batch_next_token_logprobs(contexts, lora_name="a"))
    expected = [mock_logprobs(c, 16, seed=1).astype(np.float32) for c in contexts]
    np.testing.assert_array_equal(rows.numpy(), expected)
    np.testing.assert_array_equal(
        adapted.batch_next_token_logprobs_sync(contexts, lora_name="a").numpy(), expected
    )
    assert asyncio.run(plain.sample([1, 2], 4, [3], seed=0, lora_name=None))
    adapted.asked.clear()
    drawn = asyncio.run(adapted.batch_sample([[1, 2], [4]], 5, [3], seed=2, lora_name="a"))
    assert set(adapted.asked) == {"a"}

    def adapted_row(context):
        return mock_logprobs(context, 16, seed=1).astype(np.float32)

    for prompt, tokens in zip([[1, 2], [4]], drawn):  # core's sampler over adapter a's rows
        assert tokens == core_draw(adapted_row, prompt, 5, seed=2)
    core.close()


def test_sample_eos_ids_may_be_a_tensor():
    """EOS ids given as a torch tensor stop a draw as a list does (a tensor's elements hash
    by identity: kept as they were, no drawn token matched them)."""
    mock = MockAsyncLM.from_name("stories260K")
    greedy = asyncio.run(mock.sample(CONTEXTS[1], 6, [], temperature=0))
    eos = greedy[2]
    as_list = asyncio.run(mock.sample(CONTEXTS[1], 6, [eos], temperature=0))
    assert as_list == greedy[: greedy.index(eos)]
    assert asyncio.run(mock.sample(CONTEXTS[1], 6, torch.tensor([eos]), temperature=0)) == as_list
    lm = RowsOf(mock.core_lm)
    assert asyncio.run(lm.sample(CONTEXTS[1], 6, torch.tensor([eos]), temperature=0)) == as_list
    with pytest.raises(TypeError, match="eos_token_ids"):
        asyncio.run(mock.sample(CONTEXTS[1], 6, [2.5]))
    mock.close()


def test_sample_with_lora_name_draws_from_that_adapter(tmp_path):
    """The model classes' sample and batch_sample take lora_name (0.3.1): the same seed
    draws what it draws with that adapter made current by set_lora."""
    llm = with_random_adapter(tmp_path)
    prompts = [CONTEXTS[0], CONTEXTS[1]]
    named = [asyncio.run(llm.sample(p, 6, [2], seed=4, lora_name="a")) for p in prompts]
    batch = asyncio.run(llm.batch_sample(prompts, 6, [2], seed=4, lora_name="a"))
    base = [asyncio.run(llm.sample(p, 6, [2], seed=4)) for p in prompts]
    llm.set_lora(lora_name="a")
    current = [asyncio.run(llm.sample(p, 6, [2], seed=4)) for p in prompts]
    assert named == batch == current
    assert named != base  # the adapter changes the draws
    # Both stop where the context reaches the model's limit (the last token is drawn from a
    # context of exactly the limit), rather than fail there.
    llm.core_lm.max_context_length = len(prompts[0]) + 2
    short = asyncio.run(llm.sample(prompts[0], 6, [], seed=4, lora_name="a"))
    assert short == asyncio.run(llm.sample(prompts[0], 6, [], seed=4))[:3] and len(short) == 3
    llm.close()


def test_load_model_by_name_lets_the_registry_choose(monkeypatch):
    """backend=None takes the registry's best usable backend among those the facade wraps
    (mlx where it is auto-selected, as on Apple silicon); explicit names are checked there."""
    from support.plugins import plugin_module

    import genlm.backend.llm as facade
    from genlm.core import BackendUnavailableError
    from genlm.core.backend import PLUGIN_API, BackendSpec, Registry

    def registry(*specs):
        reg = Registry()
        reg.register_plugins(
            [(s.name, s.distribution, plugin_module(f"plugin_{s.name}", s)) for s in specs]
        )
        return reg

    def backend(name, priority, auto_select=True, probe=None):
        return BackendSpec(
            name=name,
            loader="genlm.core.mock:MockLM.from_name",
            distribution=f"genlm-backend-{name}",
            priority=priority,
            auto_select=auto_select,
            probe=probe,
            plugin_api=PLUGIN_API,
        )

    loaded = []
    for cls in facade._CLASSES.values():
        monkeypatch.setattr(cls, "from_name", classmethod(lambda c, name: loaded.append(c)))
    no_cuda = backend("vllm", 30, probe=lambda: "needs CUDA")
    apple = registry(no_cuda, backend("mlx", 20), backend("hf", 10), backend("foo", 99))
    linux = registry(no_cuda, backend("mlx", 20, auto_select=False), backend("hf", 10))
    for reg, expected in ((apple, facade.AsyncMlxLM), (linux, facade.AsyncTransformer)):
        monkeypatch.setattr(facade, "get_registry", lambda reg=reg: reg)
        facade.load_model_by_name("stories260K")
        assert loaded.pop() is expected
    facade.load_model_by_name("stories260K", backend="mlx")  # mlx by name runs off Apple too
    assert loaded.pop() is facade.AsyncMlxLM
    with pytest.raises(BackendUnavailableError, match="needs CUDA"):
        facade.load_model_by_name("stories260K", backend="vllm")
    with pytest.raises(ValueError, match="Invalid backend"):
        facade.load_model_by_name("stories260K", backend="foo")


def test_a_missing_engine_plugin_is_an_import_error(monkeypatch):
    """backend="vllm" or "mlx" without its GenLM plugin raises ImportError naming what to
    install, as genlm-backend does without the engine (it was only a ValueError, so a
    caller falling back on ImportError broke); it stays a BackendNotFoundError too. The
    classes' from_name say the same."""
    import importlib

    import genlm.backend.llm as facade
    from genlm.core import BackendNotFoundError
    from genlm.core.backend import Registry

    monkeypatch.setattr(facade, "get_registry", Registry)  # no plugin registered at all
    real_import = importlib.import_module

    def without_plugins(name, *args):
        if name.startswith("genlm.backends."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_plugins)
    for backend, cls in (("vllm", AsyncVirtualLM), ("mlx", AsyncMlxLM)):
        with pytest.raises(ImportError, match=f"genlm-backend-{backend}") as raised:
            load_model_by_name("stories260K", backend=backend)
        assert isinstance(raised.value, BackendNotFoundError)
        with pytest.raises(ImportError, match=f"pip install genlm-backend-{backend}"):
            cls.from_name("stories260K")


def test_bitsandbytes_opts_without_its_libraries_names_the_pip_install(monkeypatch):
    """0.3.1 required accelerate and bitsandbytes, this distribution does not: its
    bitsandbytes_opts without them is an ImportError naming the one pip command for both,
    where transformers asked for accelerate, then for bitsandbytes."""
    for name in ("bitsandbytes", "accelerate"):
        monkeypatch.setitem(sys.modules, name, None)  # not installed: find_spec is None
    with pytest.raises(ImportError, match="pip install bitsandbytes accelerate"):
        AsyncTransformer.from_name("stories260K", bitsandbytes_opts={"load_in_8bit": True})


def test_batch_size_and_timeout_are_readable_and_settable(hf_llm):
    """genlm-backend's documented attributes: they read and set core's batcher options,
    and refuse values the batcher could not use."""
    batcher = hf_llm.core_lm.batcher
    before = (hf_llm.batch_size, hf_llm.timeout)
    assert before == (batcher.max_batch_size, batcher.max_wait_s)
    hf_llm.batch_size, hf_llm.timeout = np.int64(7), 0.25
    assert (batcher.max_batch_size, batcher.max_wait_s) == (7, 0.25)
    for bad, error in ((0, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="batch_size"):
            hf_llm.batch_size = bad
    for bad, error in ((-1.0, ValueError), (float("nan"), ValueError), ("1", TypeError)):
        with pytest.raises(error, match="timeout"):
            hf_llm.timeout = bad
    hf_llm.batch_size, hf_llm.timeout = before


def test_clear_cache_drops_the_kv_cache_kv_kept(hf_llm):
    """clear_cache clears "log probabilities and key/value pairs", as documented: a prompt
    kept by cache_kv is dropped too (its KV stayed, and an extension reused it)."""
    prompt = CONTEXTS[0]
    hf_llm.cache_kv(prompt)
    assert hf_llm.core_lm.kv.nbytes > 0
    hf_llm.clear_cache()
    assert hf_llm.core_lm.kv.nbytes == 0 and len(hf_llm.core_lm.output_cache) == 0
    before = hf_llm.core_lm.kv_stats["computed_tokens"]
    hf_llm.next_token_logprobs_sync(prompt + [40])
    assert hf_llm.core_lm.kv_stats["computed_tokens"] - before == len(prompt) + 1


def test_clearing_a_closed_model_is_a_no_op():
    """clear_cache and clear_kv_cache after close do nothing, as core's clear_cache does:
    the facade's clear_cache, which now clears the KV too, raised ModelClosedError."""
    llm = AsyncTransformer.from_name("stories260K")
    llm.next_token_logprobs_sync(CONTEXTS[0])
    llm.close()
    llm.clear_cache()
    llm.clear_kv_cache()
    assert len(llm.core_lm.output_cache) == 0 and llm.core_lm.kv.nbytes == 0


def test_the_documented_modules_hold_the_classes():
    """0.3's API pages document each class in its own module (``genlm.backend.llm.hf``...);
    importing from there gives the facade's classes (``genlm.backend.llm`` was one module,
    so ``from genlm.backend.llm.mlx import AsyncMlxLM`` was a ModuleNotFoundError)."""
    import importlib

    import genlm.backend.llm as llm

    documented = {
        "base": ["AsyncLM", "MockAsyncLM"],
        "hf": ["AsyncTransformer"],
        "vllm": ["AsyncVirtualLM"],
        "mlx": ["AsyncMlxLM"],
    }
    for module, names in documented.items():
        loaded = importlib.import_module(f"genlm.backend.llm.{module}")
        assert loaded.__all__ == names
        for name in names:
            assert getattr(loaded, name) is getattr(llm, name)


class Forced(AsyncTransformer):
    """A subclass that changes rows where 0.3.1 let it (its own ``next_token_logprobs``):
    every row puts all its mass on token 5."""

    def _forced(self):
        row = torch.full((len(self.vocab),), -torch.inf)
        row[5] = 0.0
        return row

    async def next_token_logprobs(self, token_ids, lora_name=None):
        return self._forced()

    def next_token_logprobs_sync(self, token_ids, lora_name=None):
        return self._forced()


def test_a_subclass_with_its_own_rows_samples_and_batches_from_them():
    """0.3.1 built the batch calls, ``sample`` and ``batch_sample`` on
    ``next_token_logprobs``; the facade sent them to its core model, past the subclass."""
    llm = Forced.from_name("stories260K", device="cpu")
    try:
        assert asyncio.run(llm.sample([1, 20], 3, [], seed=0)) == [5, 5, 5]
        assert asyncio.run(llm.batch_sample([[1, 20], [1, 30]], 2, [])) == [[5, 5], [5, 5]]
        for rows in (
            asyncio.run(llm.batch_next_token_logprobs(CONTEXTS)),
            llm.batch_next_token_logprobs_sync(CONTEXTS),
        ):
            assert rows.shape == (3, len(llm.vocab)) and (rows.argmax(dim=1) == 5).all()
            assert torch.isinf(rows).sum() == 3 * (len(llm.vocab) - 1)
        # Core's keywords keep core's rows (genlm.core APIs ask for them).
        core_rows = llm.batch_next_token_logprobs_sync(CONTEXTS, output="numpy")
        np.testing.assert_array_equal(
            core_rows, llm.core_lm.batch_next_token_logprobs_sync(CONTEXTS)
        )
    finally:
        llm.close()


def test_a_negative_seed_samples_as_torch_reads_it(hf_llm):
    """0.3.1 seeded torch, which takes -2**63 to 2**64 - 1 (``hash()``-derived seeds are
    often negative): a negative seed is its two's complement, where core refused it."""
    for seed in (-1, -987654321):
        tokens = asyncio.run(hf_llm.sample(CONTEXTS[2], 6, [], seed=seed))
        assert tokens == asyncio.run(hf_llm.sample(CONTEXTS[2], 6, [], seed=seed + 2**64))


class OwnVocab(AsyncLM):
    """A subclass of the documented base class keeping an attribute named ``vocab`` (0.3.1's
    base class had none)."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.vocab = self.str_vocab

    async def next_token_logprobs(self, token_ids):
        return self.next_token_logprobs_sync(token_ids)

    def next_token_logprobs_sync(self, token_ids):
        return torch.log_softmax(torch.zeros(len(self.byte_vocab)), -1)


def test_a_subclass_may_set_its_own_vocab_attribute(hf_llm):
    """The facade's ``vocab`` (genlm.core's Vocabulary) gives way to a subclass's own."""
    from genlm.core import Vocabulary

    lm = OwnVocab(hf_llm.tokenizer)
    assert lm.vocab == lm.str_vocab
    mock = MockAsyncLM.from_name("stories260K")
    assert isinstance(mock.vocab, Vocabulary)
    mock.vocab = ["mine"]
    assert mock.vocab == ["mine"]
    mock.close()


def test_a_tokenizer_with_tokens_past_the_logits_lists_them_all():
    """GPT-2's tokenizer given a pad token, its model not resized: 0.3.1 serves rows as wide
    as the logits and a byte_vocab of every tokenizer token (genlm-control's "fewer logits"
    case); the facade refused the model."""
    from support.random_llama import cached_random_llama

    path = cached_random_llama("tiny")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    tok.add_special_tokens({"pad_token": "[PAD]"})
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    llm = AsyncTransformer(model, tok)
    try:
        assert len(llm.byte_vocab) == len(llm.str_vocab) == 50258
        assert llm.byte_vocab[50257].byte_string == b"[PAD]"
        assert llm.next_token_logprobs_sync(tok.encode("Hello")).shape == (50257,)
        assert (
            llm.byte_vocab[:50257]
            == decode_vocab(transformers.AutoTokenizer.from_pretrained(path))[0]
        )
    finally:
        llm.close()


class Shifted(MockAsyncLM):
    """A subclass computing its row with the batch call, then shifting it (valid on 0.3.1's
    ``AsyncVirtualLM``, whose batch calls were engine calls)."""

    async def next_token_logprobs(self, token_ids, lora_name=None):
        return (await self.batch_next_token_logprobs([token_ids], lora_name=lora_name))[0] + 1.0

    def next_token_logprobs_sync(self, token_ids, lora_name=None):
        return self.batch_next_token_logprobs_sync([token_ids], lora_name=lora_name)[0] + 1.0


def test_an_override_that_calls_the_batch_call_is_applied_once():
    """Routing the batch calls through a subclass's rows sent its own batch call back into
    it, for ever (async: no end; sync: RecursionError): a batch call made inside the
    override goes to the core model, so every way of asking shifts the row once."""
    llm = Shifted.from_name("stories260K")
    try:
        core = llm.core_lm.next_token_logprobs_sync(CONTEXTS[1], output="torch")

        async def asked():
            return [
                await llm.next_token_logprobs(CONTEXTS[1]),
                (await llm.batch_next_token_logprobs([CONTEXTS[1]]))[0],
            ]

        rows = asyncio.run(asyncio.wait_for(asked(), 30))
        rows += [
            llm.next_token_logprobs_sync(CONTEXTS[1]),
            llm.batch_next_token_logprobs_sync([CONTEXTS[1]])[0],
        ]
        for row in rows:
            torch.testing.assert_close(row, core + 1.0)
    finally:
        llm.close()


def test_add_new_lora_of_a_new_name_on_a_plugin_whose_add_lora_predates_replace():
    """A core model whose ``add_lora(path, name)`` has no ``replace`` (written before core
    had one) still loads a new name through the facade; ``replace=True`` goes only to a
    name that is loaded."""

    class OldStyleLM(MockLM):
        def __init__(self):
            super().__init__([bytes([i]) for i in range(16)])
            self.added: list[tuple[str, str]] = []

        @property
        def loaded_loras(self):
            return tuple(name for _, name in self.added)

        def add_lora(self, path, name):
            self.added.append((path, name))

    core = OldStyleLM()
    lm = MockAsyncLM._wrap(core)
    lm.add_new_lora("/adapters/a", "a")
    assert core.added == [("/adapters/a", "a")]
    with pytest.raises(TypeError, match="replace"):  # replacing needs core's add_lora
        lm.add_new_lora("/adapters/b", "a")
    core.close()
