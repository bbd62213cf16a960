"""Full-vocabulary rows from the vLLM backend against transformers' full forward."""

from __future__ import annotations

import asyncio

import numpy as np
from scipy.special import logsumexp

#: fp32 on both sides, on the well-conditioned ``tiny_mild`` model (see conftest). A row
#: mix-up differs by whole units (checked in the 32-request test).
ATOL, RTOL = 1e-4, 0.0


def distinct_contexts(n: int, seed: int, vocab: int = 50257) -> list[list[int]]:
    """``n`` distinct contexts of 1 to 120 tokens (many longer than one 32-token chunk)."""
    rng = np.random.default_rng(seed)
    out: dict[tuple[int, ...], None] = {}
    while len(out) < n:
        length = int(rng.integers(1, 121))
        out[tuple(int(t) for t in rng.integers(0, vocab, size=length))] = None
    return [list(c) for c in out]


def test_32_concurrent_requests_split_by_scheduler(vllm_lm, expected):
    """32 concurrent distinct requests via a 2-seq, 32-token scheduler each get their own row."""
    vllm_lm.clear_cache()
    contexts = distinct_contexts(32, seed=0)

    async def together():
        return await asyncio.gather(*(vllm_lm.next_token_logprobs(c) for c in contexts))

    rows = asyncio.run(together())
    truth = [expected(c) for c in contexts]
    for i, row in enumerate(rows):
        np.testing.assert_allclose(row, truth[i], atol=ATOL, rtol=RTOL)
        assert abs(logsumexp(row.astype(np.float64))) < 1e-4
        # the row is far closer to its own expectation than to any other request's
        distances = [np.abs(row - t).max() for t in truth]
        assert int(np.argmin(distances)) == i
        assert sorted(distances)[1] > 100 * ATOL


def test_shared_prefixes_and_reversed_order(vllm_lm, expected):
    """Contexts sharing prefixes (prefix-cache hits), longest first, map to their own rows."""
    vllm_lm.clear_cache()
    base = distinct_contexts(1, seed=1)[0] + distinct_contexts(1, seed=2)[0]
    contexts = [base[:n] for n in range(len(base), 0, -max(1, len(base) // 9))]
    rows = vllm_lm.batch_next_token_logprobs_sync(contexts)
    for context, row in zip(contexts, rows):
        np.testing.assert_allclose(row, expected(context), atol=ATOL, rtol=RTOL)


def test_concurrent_logprobs_and_sample_in_one_loop(vllm_lm, expected):
    """next_token_logprobs and sample awaited together in one event loop both complete correctly."""
    vllm_lm.clear_cache()
    contexts = distinct_contexts(6, seed=3)

    async def mixed():
        return await asyncio.gather(
            vllm_lm.sample(contexts[0], max_tokens=4, eos_token_ids=[], temperature=0),
            *(vllm_lm.next_token_logprobs(c) for c in contexts[1:]),
            vllm_lm.sample(contexts[1], max_tokens=3, eos_token_ids=[]),
        )

    greedy, *rows, sampled = asyncio.run(mixed())
    for context, row in zip(contexts[1:], rows):
        np.testing.assert_allclose(row, expected(context), atol=ATOL, rtol=RTOL)
    assert len(sampled) == 3 and all(0 <= t < len(vllm_lm.vocab) for t in sampled)
    context = list(contexts[0])
    for token in greedy:
        assert token == int(np.argmax(expected(context)))
        context.append(token)


def test_native_sample_stops_on_eos_ids_and_includes_it(vllm_lm, expected):
    """vLLM sampling stops at the first requested EOS id and returns it, and only there."""
    context = distinct_contexts(1, seed=4)[0]
    greedy = asyncio.run(vllm_lm.sample(context, max_tokens=6, eos_token_ids=[], temperature=0))
    assert len(greedy) == 6
    stop = greedy[3]
    stopped = asyncio.run(
        vllm_lm.sample(context, max_tokens=6, eos_token_ids=[stop], temperature=0)
    )
    assert stopped == greedy[: greedy.index(stop) + 1]


def test_native_unseeded_sampling_follows_the_distribution(vllm_lm, expected):
    """Unseeded vLLM samples at temperature 1 follow the model's distribution.

    The mean log-probability of exact draws estimates the negative entropy ``sum p log p``;
    draws from the wrong distribution (e.g. uniform, whose mean is the row's mean) would
    miss it by many standard errors on this context.
    """
    context = distinct_contexts(1, seed=5)[0]
    row = expected(context).astype(np.float64)
    p = np.exp(row)
    neg_entropy = float(p @ row)
    n = 200
    stderr = float(np.sqrt(p @ (row - neg_entropy) ** 2 / n))
    assert neg_entropy - row.mean() > 10 * stderr  # the check below can tell them apart
    draws = asyncio.run(
        vllm_lm.batch_sample([context] * n, max_tokens=1, eos_token_ids=[], temperature=1.0)
    )
    mean = np.mean([row[d[0]] for d in draws])
    assert abs(mean - neg_entropy) < 4 * stderr


def test_seeded_sampling_is_reproducible(vllm_lm):
    """The same seed gives the same tokens, a different seed (almost surely) different ones."""
    context = distinct_contexts(1, seed=6)[0]
    a = asyncio.run(vllm_lm.sample(context, max_tokens=8, eos_token_ids=[], seed=123))
    b = asyncio.run(vllm_lm.sample(context, max_tokens=8, eos_token_ids=[], seed=123))
    c = asyncio.run(vllm_lm.sample(context, max_tokens=8, eos_token_ids=[], seed=124))
    assert a == b and len(a) == 8
    assert a != c


def test_a_second_in_process_engine_is_refused_while_one_is_open(vllm_lm, tiny_path):
    """vLLM keeps an in-process engine's state process-wide: two stepping together crashed
    the process (double free), and closing one broke the other. A second model while the
    session's is open is refused before its engine starts, naming the way out."""
    import pytest

    from genlm.backends.vllm import VLLMLM

    from .conftest import ENGINE_OPTS

    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING=1"):
        VLLMLM.from_name(str(tiny_path), engine_opts=ENGINE_OPTS)
    assert vllm_lm.next_token_logprobs_sync([1, 2, 3]).shape == (len(vllm_lm.vocab),)


def test_native_sampling_leaves_tiny_temperatures_and_bad_eos_to_core(vllm_lm, monkeypatch):
    """Unseeded, a temperature below 0.01 (which vLLM raises to 0.01, a far flatter
    distribution) is drawn by core's sampler; EOS ids as a numpy array work, a bare int
    is core's TypeError (vLLM refused the array and failed on the int)."""
    import pytest

    def native(*args, **kwargs):
        raise AssertionError("vLLM's sampler was used")

    with monkeypatch.context() as patch:
        patch.setattr(vllm_lm, "_native_sample", native)
        greedy = asyncio.run(vllm_lm.sample([1, 2, 3], 3, [], temperature=0.0, seed=0))
        assert asyncio.run(vllm_lm.sample([1, 2, 3], 3, [], temperature=1e-4)) == greedy
    out = asyncio.run(vllm_lm.sample([1, 2, 3], 4, np.array([greedy[0]]), temperature=0.0))
    assert out == greedy[:1]  # stopped at the EOS given as an array
    with pytest.raises(TypeError, match="eos_token_ids must be a list"):
        asyncio.run(vllm_lm.sample([1, 2, 3], 2, 5))


def test_native_sampling_leaves_temperatures_above_two_to_core(vllm_lm, monkeypatch):
    """Unseeded, a temperature above 2 (vLLM's SamplingParams refuses it, with an error
    that is no ValueError) is drawn by core's sampler, as seeded and on every other
    backend; 2 itself, the top of vLLM's range, stays with vLLM's sampler."""
    calls = []
    native = vllm_lm._native_sample

    def counted(*args, **kwargs):
        calls.append(args)
        return native(*args, **kwargs)

    monkeypatch.setattr(vllm_lm, "_native_sample", counted)
    assert len(asyncio.run(vllm_lm.sample([1, 2, 3], 3, [], temperature=2.0))) == 3
    assert len(asyncio.run(vllm_lm.batch_sample([[1, 2, 3]], 3, [], temperature=2.0))[0]) == 3
    assert len(calls) == 2
    for temperature in (2.0000001, 2.5, 1e6):
        assert len(asyncio.run(vllm_lm.sample([1, 2, 3], 3, [], temperature=temperature))) == 3
        drawn = asyncio.run(vllm_lm.batch_sample([[1, 2], [3]], 3, [], temperature=temperature))
        assert [len(tokens) for tokens in drawn] == [3, 3]
    assert len(calls) == 2


def test_native_sampling_stops_at_the_models_context_limit(vllm_lm, monkeypatch):
    """Unseeded, as seeded, a sample stops where the context would pass max_context_length
    (a user's limit below the engine's): it drew past it, and scoring the result failed."""
    monkeypatch.setattr(vllm_lm, "max_context_length", 100)
    prompt = [1] + [5] * 94
    native = asyncio.run(vllm_lm.sample(prompt, 20, [], temperature=1.0))
    seeded = asyncio.run(vllm_lm.sample(prompt, 20, [], temperature=1.0, seed=0))
    assert len(native) == len(seeded) == 100 + 1 - len(prompt)


def test_the_logprobs_route_refuses_engine_options_it_cannot_read(tiny_path):
    """On the logprobs route, max_logprobs below the vocabulary and a logprobs_mode other
    than the raw log-probabilities are refused when the model is made, before its engine
    starts; they failed every request instead."""
    import pytest

    from genlm.backends.vllm import VLLMLM

    from .conftest import ENGINE_OPTS

    for bad, says in (
        ({"max_logprobs": 20}, "max_logprobs=-1"),
        ({"logprobs_mode": "processed_logits"}, "logprobs_mode='raw_logprobs'"),
    ):
        with pytest.raises(ValueError, match=says):
            VLLMLM.from_name(
                str(tiny_path), engine_opts={**ENGINE_OPTS, **bad}, row_source="logprobs"
            )
