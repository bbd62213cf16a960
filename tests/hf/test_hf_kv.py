"""Automatic KV reuse: every request equals an uncached full forward, and KV is really reused."""

from __future__ import annotations

import asyncio
import weakref

import numpy as np
import pytest

from genlm.backends.hf import HFLM
from genlm.core import BackendError

MODELS = ["stories260K-fp64", "stories260K-fp32", "tiny-llama-fp64", "tiny-llama-fp32"]


def random_ids(rng, vocab_size, n):
    return [int(t) for t in rng.integers(3, vocab_size, n)]


@pytest.fixture(params=MODELS)
def lm(request, loaded):
    """A fresh HFLM (empty caches, output cache off so every request reaches the backend)."""
    model, tok = loaded(request.param)
    lm = HFLM(model, tok, cache_bytes=0, max_wait_s=0.01)
    yield lm
    lm.close()


def gather(lm, contexts):
    async def run():
        return await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))

    return asyncio.run(run())


def test_concurrent_requests_match_full_forward(lm, check):
    """Many concurrent requests extending cached prefixes by different amounts all match."""
    rng = np.random.default_rng(0)
    v = len(lm.vocab)
    prompt = random_ids(rng, v, 24)
    gather(lm, [prompt[:6], prompt])
    contexts = [
        prompt[:k] + random_ids(rng, v, j) for k in (0, 3, 6, 13, 24) for j in (1, 2, 5, 11)
    ]
    contexts = [c for c in contexts if c] + [prompt[:6] + [7], prompt + [9]]
    before = dict(lm.kv_stats)
    rows = gather(lm, contexts)
    for context, row in zip(contexts, rows):
        check(lm.model, context, row)
        assert row.dtype == np.float32
    assert lm.kv_stats["reused_tokens"] > before["reused_tokens"]


def test_smc_pattern_runs_one_new_token_per_particle(lm, check):
    """Particles sharing a prompt, each extended by one token per step, run one token each."""
    rng = np.random.default_rng(1)
    v = len(lm.vocab)
    prompt = random_ids(rng, v, 40)
    particles = [list(prompt) for _ in range(8)]
    for step in range(6):
        before = lm.kv_stats["computed_tokens"]
        rows = gather(lm, particles)
        distinct = len({tuple(p) for p in particles})
        expected_new = len(prompt) if step == 0 else distinct
        assert lm.kv_stats["computed_tokens"] - before == expected_new
        for particle, row in zip(particles, rows):
            check(lm.model, particle, row)
            probs = np.exp(row.astype(np.float64))
            particle.append(int(rng.choice(v, p=probs / probs.sum())))
    assert lm.kv_stats["resident_rows"] > 0  # later steps found their past still in place


def test_resampled_particles_stay_exact(lm, check):
    """Particles that swap places and duplicate each other between steps (SMC resampling)."""
    rng = np.random.default_rng(6)
    v = len(lm.vocab)
    particles = [random_ids(rng, v, 20) for _ in range(6)]
    for _ in range(5):
        rows = gather(lm, particles)
        for particle, row in zip(particles, rows):
            check(lm.model, particle, row)
        order = rng.integers(0, len(particles), len(particles))
        particles = [list(particles[i]) + [int(rng.integers(3, v))] for i in order]


def test_one_batch_mixes_past_and_new_lengths(lm, check):
    """A single forward pass with different cached lengths and new lengths per row is exact."""
    rng = np.random.default_rng(2)
    v = len(lm.vocab)
    base = random_ids(rng, v, 12)
    lm.next_token_logprobs_sync(base[:3])
    lm.next_token_logprobs_sync(base[:9])
    contexts = [
        random_ids(rng, v, 4),  # no past, 4 new
        base[:3] + [5],  # past 3, 1 new
        base[:3] + random_ids(rng, v, 6),
        base[:9] + random_ids(rng, v, 2),
        base[:9],  # exact cached context: past 8, recompute the last token only
    ]
    forwards = lm.kv_stats["forwards"]
    rows = lm.worker.call(lm._logprobs_batch, [tuple(c) for c in contexts], None)
    assert lm.kv_stats["forwards"] == forwards + 1
    for context, row in zip(contexts, rows):
        check(lm.model, context, row)


def test_exact_repeat_recomputes_only_the_last_token(lm, check):
    """With the output cache off, a repeated context runs one token on top of its own KV."""
    context = list(range(5, 25))
    first = lm.next_token_logprobs_sync(context)
    before = lm.kv_stats["computed_tokens"]
    again = lm.next_token_logprobs_sync(context)
    assert lm.kv_stats["computed_tokens"] - before == 1
    check(lm.model, context, first)
    check(lm.model, context, again)


def test_eviction_pressure_stays_exact_and_bounded(loaded, check):
    """A KV budget of a few tokens evicts constantly; results stay exact, bytes stay bounded."""
    model, tok = loaded("stories260K-fp64")
    probe = HFLM(model, tok, cache_bytes=0)
    budget = 6 * probe.shape.bytes_per_token + 512
    probe.close()
    lm = HFLM(model, tok, cache_bytes=0, kv_cache_bytes=budget)
    rng = np.random.default_rng(3)
    prompt = random_ids(rng, 512, 10)
    particles = [list(prompt) for _ in range(6)]
    for _ in range(5):
        rows = gather(lm, particles)
        assert lm.kv.nbytes <= budget
        for particle, row in zip(particles, rows):
            check(model, particle, row)
            particle.append(int(rng.integers(3, 512)))
    lm.close()


def test_orphaned_segment_is_dropped_and_recomputed(lm, check):
    """When a parent entry is evicted, its child is unusable: the lookup drops it, stays exact."""
    prompt = list(range(10, 20))
    lm.next_token_logprobs_sync(prompt)
    lm.next_token_logprobs_sync(prompt + [7])
    assert lm.kv.cache.remove((-1, *prompt))
    entries = len(lm.kv)
    before = lm.kv_stats["computed_tokens"]
    row = lm.next_token_logprobs_sync(prompt + [7, 8])
    assert lm.kv_stats["computed_tokens"] - before == len(prompt) + 2
    assert len(lm.kv) == entries  # the orphan went, the recomputed context came
    check(lm.model, prompt + [7, 8], row)


def test_pinned_prompt_survives_pressure_and_clear_cache(loaded, check):
    """cache_kv pins a prompt's KV through eviction and clear_cache; clear_kv_cache drops it."""
    model, tok = loaded("tiny-llama-fp64")
    probe = HFLM(model, tok, cache_bytes=0)
    per_token = probe.shape.bytes_per_token
    probe.close()
    prompt = list(range(100, 132))
    lm = HFLM(model, tok, cache_bytes=0, kv_cache_bytes=(len(prompt) + 8) * per_token + 4096)
    lm.cache_kv(prompt)
    rng = np.random.default_rng(4)
    gather(lm, [random_ids(rng, 50257, 12) for _ in range(6)])  # churn the unpinned space
    before = lm.kv_stats["computed_tokens"]
    check(model, prompt + [11], lm.next_token_logprobs_sync(prompt + [11]))
    assert lm.kv_stats["computed_tokens"] - before == 1
    lm.clear_cache()
    before = lm.kv_stats["computed_tokens"]
    check(model, prompt + [12], lm.next_token_logprobs_sync(prompt + [12]))
    assert lm.kv_stats["computed_tokens"] - before == 1
    lm.clear_kv_cache()
    assert len(lm.kv) == 0
    before = lm.kv_stats["computed_tokens"]
    check(model, prompt + [13], lm.next_token_logprobs_sync(prompt + [13]))
    assert lm.kv_stats["computed_tokens"] - before == len(prompt) + 1
    lm.close()


@pytest.mark.parametrize("clear", ["clear_kv_cache", "clear_cache"])
def test_clears_release_the_batch_buffer(loaded, check, clear):
    """The batch KV buffer kept between batches (outside kv_cache_bytes, up to 512 MiB) is
    released by both clears, even with no KV cache at all, and the next request still
    equals a full forward."""
    model, tok = loaded("stories260K-fp32")
    lm = HFLM(model, tok, cache_bytes=0, kv_cache_bytes=0)
    rng = np.random.default_rng(9)
    gather(lm, [[1, *random_ids(rng, 500, 40)] for _ in range(4)])
    kept = weakref.ref(lm._buffer)
    getattr(lm, clear)()
    assert kept() is None
    context = [1, *random_ids(rng, 500, 12)]
    check(model, context, lm.next_token_logprobs_sync(context))
    lm.close()


def test_a_pinned_prompt_is_never_copied_into_a_continuation(loaded, check):
    """A long continuation of a pinned prompt stores its own tokens only: its segment never
    absorbs the pinned one (a copy of the shared prompt per particle), so with room for the
    prompt and one continuation, each later step computes one token."""
    model, tok = loaded("stories260K-fp64")
    probe = HFLM(model, tok, cache_bytes=0)
    per_token = probe.shape.bytes_per_token
    probe.close()
    rng = np.random.default_rng(8)
    prompt = [1, *random_ids(rng, 500, 99)]
    lm = HFLM(model, tok, cache_bytes=0, kv_cache_bytes=250 * per_token)
    lm.cache_kv(prompt)
    context = prompt + random_ids(rng, 500, 100)
    try:
        for step in range(4):
            before = lm.kv_stats["computed_tokens"]
            check(model, context, lm.next_token_logprobs_sync(context))
            assert lm.kv_stats["computed_tokens"] - before == (100 if step == 0 else 1)
            assert lm.kv.nbytes <= (len(context) + 2) * per_token  # no second prompt copy
            context = context + [7]
    finally:
        lm.close()


def test_cache_kv_too_big_for_budget_raises(loaded):
    """Pinning a prompt whose KV exceeds the budget fails clearly instead of silently."""
    model, tok = loaded("stories260K-fp64")
    lm = HFLM(model, tok, kv_cache_bytes=1024)
    with pytest.raises(MemoryError, match="kv_cache_bytes"):
        lm.cache_kv(list(range(5, 60)))
    lm.close()


def test_a_cache_kv_that_does_not_fit_pins_nothing(loaded):
    """A prompt whose cached part fits but whose whole KV does not: cache_kv raises and pins
    nothing (each failed call pinned the cached part for good, until pins held the budget),
    and a prompt that fits alone but not beside the pinned ones is told so."""
    model, tok = loaded("stories260K-fp64")
    per_token = HFLM(model, tok, kv_cache_bytes=0).shape.bytes_per_token
    lm = HFLM(model, tok, cache_bytes=0, kv_cache_bytes=30 * per_token + 100)
    try:
        prefix = list(range(5, 14))
        for i in range(3):
            lm.next_token_logprobs_sync(prefix)  # its KV is cached, unpinned
            with pytest.raises(MemoryError, match=r"34-token prompt .* does not fit in kv_c"):
                lm.cache_kv(prefix + list(range(100 + 25 * i, 125 + 25 * i)))
            assert not lm.kv.cache.is_pinned((-1, *prefix))
        lm.cache_kv(list(range(200, 220)))  # 20 tokens pinned
        with pytest.raises(MemoryError, match="beside the prompts already pinned"):
            lm.cache_kv(list(range(300, 315)))  # 15 tokens: fits alone, not beside
        lm.clear_kv_cache()
        lm.cache_kv(list(range(300, 315)))  # unpinned: fits
    finally:
        lm.close()
    # A budget of exactly the prompt's tensor bytes holds no segment's bookkeeping too:
    # with nothing pinned the prompt does not fit in it (blaming pinned prompts misled).
    lm = HFLM(model, tok, cache_bytes=0, kv_cache_bytes=10 * per_token)
    try:
        with pytest.raises(MemoryError, match=r"10-token prompt .* does not fit in kv_c"):
            lm.cache_kv(list(range(5, 15)))
    finally:
        lm.close()


def test_sample_is_seeded_and_greedy_follows_full_forward(lm, reference):
    """Seeded samples repeat; greedy sampling picks the full forward's argmax at every step."""
    prompt = [1, 403, 407, 261] if len(lm.vocab) == 512 else [464, 3290, 318]
    a = asyncio.run(lm.sample(prompt, max_tokens=6, eos_token_ids=[], seed=3))
    b = asyncio.run(lm.sample(prompt, max_tokens=6, eos_token_ids=[], seed=3))
    assert a == b
    greedy = asyncio.run(lm.sample(prompt, max_tokens=5, eos_token_ids=[], temperature=0))
    context = list(prompt)
    for token in greedy:
        assert token == int(np.argmax(reference(lm.model, context)))
        context.append(token)


class _FailOnce:
    """Wraps a model: the next call raises (as a CUDA out-of-memory would), later calls pass."""

    def __init__(self, model):
        self.model = model
        self.armed = True

    def __call__(self, *args, **kwargs):
        if self.armed:
            self.armed = False
            raise RuntimeError("CUDA out of memory (injected)")
        return self.model(*args, **kwargs)


def test_failed_forward_never_leaves_stale_resident_rows(loaded, check, monkeypatch):
    """A forward that fails after the batch buffer was refilled must not leave a stale record.

    Step 2 leaves each particle's KV in its row of the kept buffer. The failing step puts
    particle 1's past into row 0 (a resampled batch) and then the forward raises. The next
    step extends each particle in place: row 0 must not be taken as still holding particle 0.
    """
    model, tok = loaded("stories260K-fp64")
    lm = HFLM(model, tok, cache_bytes=0, max_wait_s=0.01)
    prompt = [1, 403, 407, 261, 300, 310, 320, 330]
    particles = [prompt + [t] for t in (11, 12, 13, 14)]  # distinct last tokens
    gather(lm, [prompt])
    gather(lm, particles)
    resampled = [particles[1] + [5], particles[0] + [6], particles[3] + [7], particles[2] + [8]]
    monkeypatch.setattr(lm, "model", _FailOnce(model))
    with pytest.raises(RuntimeError, match="injected"):
        gather(lm, resampled)
    monkeypatch.undo()
    extended = [p + [9] for p in particles]
    for context, row in zip(extended, gather(lm, extended)):
        check(model, context, row)
    lm.close()


def test_multi_query_gpt_bigcode_rows_equal_a_full_forward(loaded, check):
    """GPTBigCode (multi-query attention, one KV head) serves rows equal to a plain
    forward, KV reused: on transformers 4.57 its cache comes back as an
    EncoderDecoderCache, whose layers HFLM did not read (an AttributeError when made)."""
    import torch
    import transformers

    _, tok = loaded("stories260K-fp64")
    config = transformers.GPTBigCodeConfig(
        vocab_size=512, n_embd=32, n_layer=2, n_head=4, n_positions=64, multi_query=True
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    lm = HFLM(model, tok, cache_bytes=0)
    try:
        for context in ([1, 5, 6, 7], [1, 5, 6, 7, 8], [1, 9], [1, 5, 6, 7, 8, 10, 11]):
            check(model, context, lm.next_token_logprobs_sync(context))
        assert lm.kv_stats["reused_tokens"] > 0
    finally:
        lm.close()


def _nan_output(module, inputs, output):
    """A forward hook making a layer's output NaN (a numerical blow-up in one forward)."""
    if isinstance(output, tuple):
        return (output[0] * float("nan"), *output[1:])
    return output * float("nan")


def test_a_batch_refused_for_nan_rows_leaves_no_kv_behind(loaded, check):
    """A forward whose rows come out NaN (core refuses the batch) keeps none of their KV or
    resident rows: the contexts, and a continuation of one, asked again alone once the
    model computes normally, equal a full forward (they resumed from the NaN KV and failed
    too, until clear_kv_cache)."""
    model, tok = loaded("stories260K-fp64")
    lm = HFLM(model, tok, cache_bytes=0, max_wait_s=0.01)
    prompt = [1, 403, 407, 261, 378]
    hook = model.model.layers[0].register_forward_hook(_nan_output)
    try:
        with pytest.raises(BackendError, match="NaN"):
            lm.batch_next_token_logprobs_sync([prompt, prompt[:3]])
    finally:
        hook.remove()
    for context in (prompt + [11], prompt, prompt[:3] + [12]):
        check(model, context, lm.next_token_logprobs_sync(context))
    lm.close()


def test_forward_passes_use_the_transformers_cache_argument_without_warnings(loaded, check):
    """The KV cache goes to the forward under the name its signature takes (``cache`` where
    transformers deprecates ``past_key_values``), so no FutureWarning is raised, and rows
    with reused KV still equal a full forward."""
    import warnings

    model, tok = loaded("stories260K-fp32")
    lm = HFLM(model, tok, cache_bytes=0)
    contexts = [[1, 5, 9], [1, 5, 9, 13], [1, 5, 9, 13, 7]]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        rows = [lm.next_token_logprobs_sync(c) for c in contexts]
    assert lm.kv_stats["reused_tokens"] > 0
    for context, row in zip(contexts, rows):
        check(model, context, row)
    lm.close()


@pytest.mark.parametrize("adapter", [False, True])
def test_close_lets_the_weights_go(tmp_path, adapter):
    """After close nothing of the model's keeps its weights alive, with or without a LoRA
    adapter (the model stayed referenced by the closed HFLM, so `async with
    HFLM.from_name(...)` in a loop kept every old model's weights)."""
    import gc
    import weakref

    import transformers

    from genlm.core.backend import resolve_model_path

    path = resolve_model_path("stories260K")
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    weights = weakref.ref(model.lm_head.weight)
    lm = HFLM(model, tok)
    del model
    if adapter:
        peft = pytest.importorskip("peft")
        lora = peft.LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)
        fresh = transformers.AutoModelForCausalLM.from_pretrained(path)
        peft.get_peft_model(fresh, lora).save_pretrained(tmp_path)
        lm.add_lora(tmp_path, "a")
    lm.next_token_logprobs_sync([1, 403, 407])
    lm.close()
    gc.collect()
    assert weights() is None
