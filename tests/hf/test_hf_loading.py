"""Loading, plugin registration, vocabulary width and construction errors of the hf backend."""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.imports import modules_loaded_by  # noqa: E402

from genlm.backends.hf import HFLM  # noqa: E402
from genlm.core import Vocabulary, load_model_by_name  # noqa: E402
from genlm.core.backend import get_registry, resolve_model_path  # noqa: E402

STORIES = resolve_model_path("stories260K")


def test_entry_point_registers_hf_with_priority_10():
    """The installed distribution declares the hf plugin, and the registry sees it available."""
    eps = importlib.metadata.entry_points(group="genlm.backends")
    assert any(ep.name == "hf" and ep.value == "genlm.backends.hf.plugin" for ep in eps)
    spec = get_registry(refresh=True).backends["hf"]
    assert spec.priority == 10 and spec.auto_select
    assert spec.distribution == "genlm-backend-hf"
    assert spec.unavailable_reason() is None


def test_plugin_import_is_cheap():
    """Importing the plugin module does not import torch or transformers."""
    statement = "import genlm.backends.hf.plugin as p; p.unavailable_reason()"
    assert modules_loaded_by(statement, ("torch", "transformers")) == []


def test_load_model_by_name_runs_offline(check):
    """load_model_by_name('stories260K', backend='hf') loads the embedded model, on CPU here."""
    lm = load_model_by_name("stories260K", backend="hf", cache_bytes=0)
    try:
        assert isinstance(lm, HFLM)
        expected_device = "cuda" if torch.cuda.is_available() else "cpu"
        assert next(lm.model.parameters()).device.type == expected_device
        context = [1, 403, 407, 261, 378]
        row = lm.next_token_logprobs_sync(context)
        assert row.dtype == np.float32 and row.shape == (512,)
        check(lm.model, context, row)
    finally:
        lm.close()


def padded_stories():
    """fp64 stories260K with its logit rows padded from the tokenizer's 512 to 600, the
    padding rows given weights (a real checkpoint's padding rows are near zero, not absent),
    and its tokenizer (the padding holds ~2% of the mass after [1, 403, 407])."""
    tok = transformers.AutoTokenizer.from_pretrained(STORIES)
    model = transformers.AutoModelForCausalLM.from_pretrained(STORIES).double().eval()
    model.resize_token_embeddings(600)
    with torch.no_grad():
        model.get_output_embeddings().weight[512:] = 0.5
    return model, tok


@pytest.mark.parametrize("device_rows", [False, True])
def test_rows_are_as_wide_as_the_models_logits(check, reference, device_rows):
    """A model padded to 600 logits for a 512-token tokenizer gives rows of 600 entries,
    normalized over all of them (as mlx, vllm and genlm-backend 0.3.1 do); ids 512..599 are
    unused and have no bytes. Single rows, KV-reusing batches, torch rows and sampling
    all see the full width."""
    model, tok = padded_stories()
    lm = HFLM(model, tok, cache_bytes=0, device_rows=device_rows)
    try:
        assert len(lm.vocab) == 600
        assert lm.vocab.tokens[:512] == Vocabulary.from_tokenizer(tok).tokens
        assert lm.vocab.tokens[512:] == (b"",) * 88
        assert lm.vocab.unused_ids >= set(range(512, 600))
        assert lm.vocab.text_ids.max() < 512
        context = [1, 403, 407]
        row = lm.next_token_logprobs_sync(context)
        assert row.shape == (600,)
        check(model, context, row)  # log_softmax over all 600 logits
        assert abs(np.logaddexp.reduce(row.astype(np.float64))) < 1e-6
        assert np.exp(np.logaddexp.reduce(row[512:].astype(np.float64))) > 0.01  # padding counts
        contexts = [[*context, 261], [*context, 261, 378], [1, 20]]
        rows = lm.batch_next_token_logprobs_sync(contexts, output="torch")
        assert lm.kv_stats["reused_tokens"] > 0 and tuple(rows.shape) == (3, 600)
        for c, r in zip(contexts, rows):
            check(model, c, r.cpu().numpy())
        greedy = asyncio.run(lm.sample(context, 1, temperature=0))
        assert greedy == [int(np.argmax(reference(model, context)))]
    finally:
        lm.close()


def test_a_tokenizer_wider_than_the_models_logits_is_refused():
    """stories260K cut to 500 logits for its 512-token tokenizer: a ValueError naming both
    sizes at construction, not rows too narrow for the vocabulary's ids."""
    tok = transformers.AutoTokenizer.from_pretrained(STORIES)
    model = transformers.AutoModelForCausalLM.from_pretrained(STORIES).eval()
    model.resize_token_embeddings(500)
    with pytest.raises(ValueError, match="500 output logits but its tokenizer has 512 tokens of"):
        HFLM(model, tok, cache_bytes=0)


def test_tokens_added_past_the_logits_are_left_out():
    """GPT-2's tokenizer given a pad token, its model not resized (Gemma 3 ships so): 50258
    tokens for 50257 logits was refused; the model's rows come back, the added token left
    out of the vocabulary (the model can neither read nor predict it)."""
    from support.random_llama import cached_random_llama

    path = cached_random_llama("tiny")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    tok.add_special_tokens({"pad_token": "[PAD]"})
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    lm = HFLM(model, tok, cache_bytes=0)
    try:
        assert len(lm.vocab) == 50257 and len(tok) == 50258
        context = tok.encode("Hello world")
        with torch.no_grad():
            logits = model(torch.tensor([context])).logits[0, -1]
        expected = torch.log_softmax(logits.double(), -1).numpy()
        np.testing.assert_allclose(lm.next_token_logprobs_sync(context), expected, atol=1e-4)
    finally:
        lm.close()


def test_sampling_ends_at_the_models_own_eos_ids():
    """The EOS ids of the model's generation configuration (what ``generate`` stops on)
    join the tokenizer's: greedy sampling ends at the token the model picks first once the
    configuration names it, where it ran on to ``max_tokens``."""
    tok = transformers.AutoTokenizer.from_pretrained(STORIES)
    model = transformers.AutoModelForCausalLM.from_pretrained(STORIES).eval()
    prompt = tok.encode("Once upon a time")
    with torch.no_grad():
        first = int(model(torch.tensor([prompt])).logits[0, -1].argmax())
    assert first != tok.eos_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id, first, 10**6]  # one stale id
    lm = HFLM(model, tok, cache_bytes=0)
    try:
        assert lm.vocab.eos_token_ids == (tok.eos_token_id, first)
        assert asyncio.run(lm.sample(prompt, max_tokens=5, temperature=0)) == [first]
    finally:
        lm.close()


def test_padded_rows_under_a_lora_adapter_are_full_width(reference):
    """An adapter on a padded model gives full-width rows equal to the adapted model's."""
    peft = pytest.importorskip("peft")
    model, tok = padded_stories()
    torch.manual_seed(0)
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapted = peft.get_peft_model(model, config).eval()
    context = [1, 403, 407, 261]
    expected = reference(adapted, context)
    lm = HFLM(adapted, tok, cache_bytes=0)
    try:
        assert lm.active_lora == "default" and len(lm.vocab) == 600
        np.testing.assert_allclose(lm.next_token_logprobs_sync(context), expected, atol=1e-6)
    finally:
        lm.close()


def test_a_model_without_an_output_head_must_compute_the_tokenizers_width():
    """Without output embeddings to tell the logit width, rows are the tokenizer's size: a
    model whose forward computes more logits is refused at construction, naming both."""
    model, tok = padded_stories()
    model.get_output_embeddings = lambda: None
    with pytest.raises(ValueError, match="computes 600 logits but its vocabulary has 512 ids"):
        HFLM(model, tok)


def test_wrong_tokenizer_is_rejected():
    """A tokenizer larger than the model's logits is a clear error, not garbage rows."""
    model = transformers.AutoModelForCausalLM.from_pretrained(STORIES)
    gpt2 = transformers.AutoTokenizer.from_pretrained(
        str(__import__("support.random_llama").random_llama.tokenizer_dir("gpt2"))
    )
    with pytest.raises(ValueError, match="512 output logits"):
        HFLM(model, gpt2)


def test_the_kv_budget_is_checked_by_its_name():
    """kv_cache_bytes that is not a whole number of bytes is refused naming it (the error
    named the KV store's max_bytes); a whole float (1e6) is taken."""
    model = transformers.AutoModelForCausalLM.from_pretrained(STORIES)
    tok = transformers.AutoTokenizer.from_pretrained(STORIES)
    for bad, error in ((2.5, TypeError), ("1", TypeError), (-1, ValueError)):
        with pytest.raises(error, match="kv_cache_bytes must be"):
            HFLM(model, tok, kv_cache_bytes=bad)
    lm = HFLM(model, tok, kv_cache_bytes=1e6)
    assert lm.kv.cache.max_bytes == 10**6
    lm.close()
    for option, bad in (("max_forward_tokens", 2.5), ("kv_length_multiple", "8")):
        with pytest.raises(TypeError, match=f"{option} must be an integer"):
            HFLM(model, tok, **{option: bad})
    for bad in ("stories260K", tok):  # a name, a tokenizer
        with pytest.raises(TypeError, match="HFLM takes a transformers model") as error:
            HFLM(bad, tok)
        assert type(bad).__name__ in str(error.value) and "HFLM.from_name" in str(error.value)
    for bad in ("false", 0, 1):  # "false" was truthy: torch rows
        with pytest.raises(TypeError, match="device_rows must be True, False or None"):
            HFLM(model, tok, device_rows=bad)


def test_quantization_options_fail_clearly():
    """Both quantization flags at once raise an error that says so."""
    with pytest.raises(ValueError, match="load_in_8bit"):
        HFLM.from_name("stories260K", load_in_8bit=True, load_in_4bit=True)


@pytest.mark.parametrize("installed", [(), ("bitsandbytes",), ("accelerate",)])
@pytest.mark.parametrize("how", ["load_in_8bit", "load_in_4bit", "hf_opts"])
def test_quantization_without_its_libraries_names_both_in_one_command(
    installed, how, tmp_path, monkeypatch
):
    """bitsandbytes quantization needs bitsandbytes and accelerate (device_map): missing
    either, by a flag or a BitsAndBytesConfig in hf_opts, the error names the missing one and
    the one pip command for both (following a message that named bitsandbytes alone, the
    user met a second error asking for accelerate)."""
    for name in ("bitsandbytes", "accelerate"):
        if name in installed:  # an importable stand-in: only its presence is checked
            (tmp_path / name).mkdir()
            (tmp_path / name / "__init__.py").write_text("")
        else:
            monkeypatch.setitem(sys.modules, name, None)  # find_spec None, import fails
    monkeypatch.syspath_prepend(str(tmp_path))
    if how == "hf_opts":
        config = transformers.BitsAndBytesConfig(load_in_8bit=True)
        options = {"hf_opts": {"quantization_config": config}}
    else:
        options = {how: True}
    missing = [m for m in ("bitsandbytes", "accelerate") if m not in installed]
    with pytest.raises(ImportError, match="pip install bitsandbytes accelerate") as error:
        HFLM.from_name("stories260K", **options)
    assert f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed" in str(
        error.value
    )


def test_from_name_dtype_and_hf_opts():
    """dtype picks the weight dtype; hf_opts reach from_pretrained."""
    lm = HFLM.from_name("stories260K", dtype="float64", hf_opts={"attn_implementation": "eager"})
    try:
        assert next(lm.model.parameters()).dtype == torch.float64
        assert lm.model.config._attn_implementation == "eager"
        assert np.isfinite(lm.next_token_logprobs_sync([1, 2, 3])).all()
    finally:
        lm.close()
    with pytest.raises(ValueError, match="unknown dtype"):
        HFLM.from_name("stories260K", dtype="float17")


def test_a_model_whose_first_forward_fails_leaves_no_worker_thread():
    """HFLM runs one token at construction; when that fails, the error propagates and the
    worker thread it started is gone (it lived on while the error was held)."""
    import threading

    model = transformers.AutoModelForCausalLM.from_pretrained(STORIES)
    tok = transformers.AutoTokenizer.from_pretrained(STORIES)

    def broken_forward(*args, **kwargs):
        raise RuntimeError("this model cannot run here")

    model.forward = broken_forward
    before = set(threading.enumerate())
    with pytest.raises(RuntimeError, match="cannot run here") as error:
        HFLM(model, tok)
    assert error.value is not None  # the error (and its traceback) is still held
    assert set(threading.enumerate()) <= before
