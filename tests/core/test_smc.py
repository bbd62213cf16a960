"""Sequential Monte Carlo: importance weights, resampling, marginal likelihood."""

import asyncio

import numpy as np
import pytest
from scipy.special import logsumexp

from genlm.core import InvalidContextError, Vocabulary
from genlm.core.backend import BatchedLM
from genlm.core.mock import MockLM, mock_logprobs
from genlm.core.smc import (
    Particle,
    SMCResult,
    effective_sample_size,
    forbid_bytes,
    smc,
    systematic_resample,
)

VOCAB = [b"a", b"b", b"c", b"d", b"e"]


@pytest.fixture
def lm():
    """A mock model over :data:`VOCAB`, closed after the test."""
    model = MockLM(VOCAB)
    yield model
    model.close()


def run_smc(lm, prompt, **kwargs):
    """One SMC run; no token is EOS unless ``eos_token_ids`` says otherwise."""
    return asyncio.run(smc(lm, prompt, **{"eos_token_ids": []} | kwargs))


def test_exact_proposal_keeps_equal_weights(lm):
    """With temperature 1 the weights stay 0 (up to float32 rounding of the rows)."""
    result = run_smc(lm, [0], n_particles=6, max_tokens=4, seed=1)
    assert all(abs(p.log_weight) < 1e-5 for p in result.particles)
    assert result.log_marginal == pytest.approx(0.0, abs=1e-5)
    assert all(len(p.tokens) == 4 for p in result.particles)


def test_weights_are_log_p_minus_log_q_of_the_drawn_tokens(lm):
    """Without resampling, each weight equals sum(log p - log q) recomputed by hand."""
    temperature = 2.0
    result = run_smc(
        lm, [0], n_particles=5, max_tokens=3, temperature=temperature, ess_threshold=0, seed=3
    )
    for particle in result.particles:
        expected, context = 0.0, [0]
        for token in particle.tokens:
            logp = mock_logprobs(context, 5).astype(np.float32).astype(np.float64)
            logq = logp / temperature - logsumexp(logp / temperature)
            expected += logp[token] - logq[token]
            context.append(token)
        assert particle.log_weight == pytest.approx(expected, abs=1e-9)


def test_weighted_particles_estimate_the_model_distribution(lm):
    """Importance-weighted first tokens from a tempered proposal match the model's probabilities."""
    result = run_smc(
        lm, [1], n_particles=4000, max_tokens=1, temperature=3.0, ess_threshold=0, seed=0
    )
    estimate = np.zeros(5)
    for particle, weight in zip(result.particles, result.weights):
        estimate[particle.tokens[0]] += weight
    np.testing.assert_allclose(estimate, np.exp(mock_logprobs([1], 5)), atol=0.03)


def test_eos_stops_a_particle(lm):
    """A particle that draws an EOS token stops growing."""
    result = run_smc(lm, [0], n_particles=8, max_tokens=6, seed=2, eos_token_ids=[1])
    for p in result.particles:
        assert 1 not in p.tokens[:-1]
        assert len(p.tokens) == 6 or p.tokens[-1] == 1


def test_resampling_helpers():
    """ESS of equal weights is n; systematic resampling keeps a dominant particle."""
    assert effective_sample_size(np.zeros(10)) == pytest.approx(10)
    keep = systematic_resample(np.log(np.array([1e-9, 1.0, 1e-9])), np.random.default_rng(0))
    assert list(keep) == [1, 1, 1]


@pytest.mark.parametrize("offset", [0.0, -1e5, -1e16, -3e30, -3.4e38])
def test_weights_and_ess_hold_at_any_magnitude(offset):
    """Equal weights have ESS n and normalized weights 1/n however large their log-weights
    (normalizing with lw - logsumexp(lw) lost log n: ESS 1/4 at -3e30, 6.8 of 8 at -1e16,
    weights summing to n); weights e^0 and e^-2 apart give the brute-force ESS
    (1 + e^-2)^2 / (1 + e^-4) wherever both are representable."""
    for n in (4, 8):
        lw = np.full(n, offset)
        assert effective_sample_size(lw) == n
        weights = SMCResult([Particle([], x) for x in lw], 0.0).weights
        np.testing.assert_allclose(weights, np.full(n, 1 / n), rtol=1e-15)
    if offset >= -1e16:  # the ulp of 1e16 is 2: offset - 2 is exact
        lw = np.array([offset, offset - 2.0])
        expected = (1 + np.exp(-2)) ** 2 / (1 + np.exp(-4))
        assert effective_sample_size(lw) == pytest.approx(expected, rel=1e-14)
        np.testing.assert_allclose(
            SMCResult([Particle([], x) for x in lw], 0.0).weights,
            [1 / (1 + np.exp(-2)), np.exp(-2) / (1 + np.exp(-2))],
            rtol=1e-14,
        )


def test_equal_weights_under_a_huge_finite_mask_never_resample():
    """A model that puts all its mass on a token the mask forbids, masking the rest with
    -1e30: every particle gains the same huge negative increment each step, so the weights
    stay equal and nothing is resampled (the absorbed log n made every step resample)."""

    class Peaked(MockLM):
        def _logprobs_batch(self, contexts, variant):
            rows = np.full((len(contexts), len(self.vocab)), -1e30, dtype=np.float32)
            rows[:, 2] = 0.0
            return rows

    lm = Peaked([b"a", b"b", b"c", b"d"])
    try:
        result = run_smc(
            lm, [0], n_particles=4, max_tokens=3, seed=0, token_mask=[True, True, False, True]
        )
    finally:
        lm.close()
    assert result.resampled_at == ()
    assert len({p.log_weight for p in result.particles}) == 1
    assert result.ess == 4


def test_bad_arguments_are_rejected(lm):
    """Zero particles, a non-positive or non-finite temperature (NaN used to end in a
    misleading "mask allows no token" RuntimeError), or a non-integer or negative
    max_tokens (-1 used to return empty particles) is a clear error before any work."""
    with pytest.raises(ValueError, match="n_particles"):
        asyncio.run(smc(lm, [0], n_particles=0))
    for temperature in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            asyncio.run(smc(lm, [0], temperature=temperature))
    with pytest.raises(TypeError, match="temperature"):
        asyncio.run(smc(lm, [0], temperature=True))
    with pytest.raises(TypeError, match="max_tokens"):
        asyncio.run(smc(lm, [0], max_tokens=2.5))
    with pytest.raises(ValueError, match="max_tokens"):
        asyncio.run(smc(lm, [0], max_tokens=-1))
    assert lm.batches == []


def brute_force_posterior(vocab_size, prompt, allowed, length):
    """Every allowed sequence of ``length`` tokens, with p(x) from the mock, and their sum."""
    import itertools

    table = {}
    for seq in itertools.product([t for t in range(vocab_size) if allowed[t]], repeat=length):
        context, logp = list(prompt), 0.0
        for token in seq:
            row = mock_logprobs(context, vocab_size).astype(np.float32).astype(np.float64)
            logp += row[token]
            context.append(token)
        table[seq] = np.exp(logp)
    z = sum(table.values())
    return {seq: p / z for seq, p in table.items()}, z


def test_forbid_bytes_masks_exactly_the_tokens_containing_a_forbidden_byte():
    """forbid_bytes allows a token iff none of its bytes is forbidden."""
    vocab = [b"a", b"be", b"", b"E", b"xyz", b"eee"]
    assert list(forbid_bytes(vocab, b"e")) == [True, False, True, True, True, False]
    assert list(forbid_bytes(vocab, b"ax")) == [False, True, True, True, False, True]


def test_forbid_bytes_leaves_special_tokens_allowed_and_refuses_a_str():
    """Special tokens spell no text: their display bytes (b"</s>") never match, so a
    forbidden b"s" still lets particles end; a str forbids nothing, so it is refused."""
    vocab = Vocabulary(
        (b"<s>", b"</s>", b"a", b"s", b"as", b"b"),
        special_ids={0, 1},
        bos_token_id=0,
        eos_token_ids=(1,),
    )
    assert list(forbid_bytes(vocab, b"s")) == [True, True, True, False, False, True]
    assert list(forbid_bytes(vocab.byte_vocab, b"s"))[:2] == [False, False]  # all as text
    with pytest.raises(TypeError, match="forbidden must be bytes"):
        forbid_bytes(vocab, "s")


def test_forbid_bytes_refuses_str_tokens():
    """A str token holds no byte, so it would be allowed whatever is forbidden ("hello"
    containing b"e" included): a list of str tokens is refused, naming the first one; the
    same tokens encoded mask those containing b"e"."""
    tokens = ["hello", "world", "e", "xyz"]
    with pytest.raises(TypeError, match=r"vocab\[0\] is str 'hello', not bytes"):
        forbid_bytes(tokens, b"e")
    assert list(forbid_bytes([t.encode() for t in tokens], b"e")) == [False, True, False, True]


def test_masked_weights_are_the_allowed_mass_at_temperature_one(lm):
    """At T=1 each step multiplies a weight by the allowed tokens' mass, recomputed by hand."""
    mask = forbid_bytes(VOCAB, b"e")
    result = run_smc(
        lm, [1], n_particles=16, max_tokens=3, ess_threshold=0, seed=4, token_mask=mask
    )
    weights = set()
    for particle in result.particles:
        assert 4 not in particle.tokens
        expected, context = 0.0, [1]
        for token in particle.tokens:
            row = mock_logprobs(context, 5).astype(np.float32).astype(np.float64)
            expected += logsumexp(row[mask])
            context.append(token)
        assert particle.log_weight == pytest.approx(expected, abs=1e-9)
        weights.add(round(particle.log_weight, 6))
    assert len(weights) > 1  # the constraint makes weights differ


@pytest.mark.parametrize(("temperature", "ess_threshold"), [(1.0, 0.0), (2.0, 0.0), (1.0, 1.0)])
def test_masked_smc_matches_the_brute_force_posterior(temperature, ess_threshold, lm):
    """Weighted particles estimate p(x | no 'e') over all two-token sequences, and Z."""
    mask = forbid_bytes(VOCAB, b"e")
    posterior, z = brute_force_posterior(5, [2], mask, 2)
    result = run_smc(
        lm,
        [2],
        n_particles=4000,
        max_tokens=2,
        temperature=temperature,
        ess_threshold=ess_threshold,
        seed=0,
        token_mask=mask,
    )
    estimate = dict.fromkeys(posterior, 0.0)
    for particle, weight in zip(result.particles, result.weights):
        estimate[tuple(particle.tokens)] += weight
    for seq, p in posterior.items():
        assert estimate[seq] == pytest.approx(p, abs=0.03), seq
    assert np.exp(result.log_marginal) == pytest.approx(z, rel=0.05)
    # After step 1 every particle extends the same context, so the weights are equal (ESS
    # exactly n, not below it); after step 2 they differ.
    assert result.resampled_at == ((2,) if ess_threshold == 1.0 else ())


def test_ess_property_matches_the_formula(lm):
    """SMCResult.ess is 1 / sum(w^2) of its normalized weights."""
    result = run_smc(
        lm,
        [0],
        n_particles=7,
        max_tokens=3,
        ess_threshold=0,
        seed=5,
        token_mask=forbid_bytes(VOCAB, b"ab"),
    )
    assert result.ess == pytest.approx(1 / np.sum(result.weights**2))
    assert result.ess < 7


def test_bad_masks_are_rejected(lm):
    """A mask of the wrong length, or one allowing nothing, is a clear ValueError."""
    with pytest.raises(ValueError, match="token_mask needs 5 entries"):
        asyncio.run(smc(lm, [0], token_mask=[True, False]))
    with pytest.raises(ValueError, match="allows no token"):
        asyncio.run(smc(lm, [0], token_mask=[False] * 5))


def test_particles_stop_at_the_models_context_limit():
    """With max_tokens past max_context_length the particles stop at the limit (the last
    token drawn from a context of exactly the limit) and equal an unlimited model's run
    truncated there, instead of the whole run failing with InvalidContextError once the
    contexts pass it (`genlm smc --max-tokens 600` on stories260K failed at 513 tokens).
    A prompt already over the limit still raises."""
    limited, free = MockLM(VOCAB, max_context_length=5), MockLM(VOCAB)
    kwargs = {"n_particles": 4, "seed": 2, "ess_threshold": 0.0}
    capped = run_smc(limited, [0, 1], max_tokens=50, **kwargs)
    truncated = run_smc(free, [0, 1], max_tokens=4, **kwargs)
    assert [p.tokens for p in capped.particles] == [p.tokens for p in truncated.particles]
    assert all(len(p.tokens) == 4 for p in capped.particles)
    assert capped.log_marginal == pytest.approx(truncated.log_marginal)
    with pytest.raises(InvalidContextError, match="maximum of 5"):
        asyncio.run(smc(limited, [0] * 6, max_tokens=3))
    limited.close()
    free.close()


class TrapLM(BatchedLM):
    """Over ``a b </s>``: ``a`` then ``b`` for sure, else a:b:</s> = 2:1:1. With ``b``
    forbidden, a particle that draws ``a`` has no allowed token of positive probability."""

    stable_batches = True

    def __init__(self):
        super().__init__(Vocabulary((b"a", b"b", b"</s>"), special_ids={2}, eos_token_ids=(2,)))

    def _logprobs_batch(self, contexts, variant):
        rows = []
        for context in contexts:
            if context[-1] == 0:
                rows.append([-np.inf, 0.0, -np.inf])
            else:
                rows.append(np.log([0.5, 0.25, 0.25]))
        return np.array(rows, dtype=np.float32)


def test_every_particle_dead_estimates_zero():
    """Runs where every particle reaches weight 0 estimate Z as 0 (log -inf), so the mean of
    exp(log_marginal) over runs stays unbiased; they used to raise RuntimeError, and the runs
    that returned averaged 0.75 for an exact Z of 0.25 (2 tokens from 'b', 'b' forbidden:
    only EOS first, probability 1/4)."""
    lm, mask = TrapLM(), np.array([True, False, True])
    estimates = []
    for seed in range(400):
        result = asyncio.run(smc(lm, [1], n_particles=2, max_tokens=2, seed=seed, token_mask=mask))
        estimates.append(np.exp(result.log_marginal))
        if result.log_marginal == -np.inf:
            assert result.ess == 0.0 and not result.weights.any()
    lm.close()
    estimates = np.array(estimates)
    assert (estimates == 0).any()
    standard_error = estimates.std() / np.sqrt(len(estimates))
    assert abs(estimates.mean() - 0.25) < 4 * standard_error


def test_on_step_counts_every_step_that_ran_even_the_last_of_a_dead_run():
    """``on_step`` (the CLI's progress bar) is called once per step the run made, counted
    here from the contexts the model was asked for, also for the step at which every
    particle reached weight 0 (it was not: the bar stopped a step short)."""
    lm, mask = TrapLM(), np.array([True, False, True])
    asked = lm.next_token_logprobs
    dead = 0
    for seed in range(40):
        lengths, steps = [], []

        def recording(context, lengths=lengths, **options):
            lengths.append(len(context))
            return asked(context, **options)

        lm.next_token_logprobs = recording
        result = asyncio.run(
            smc(
                lm,
                [1],
                n_particles=2,
                max_tokens=2,
                seed=seed,
                token_mask=mask,
                on_step=steps.append,
            )
        )
        dead += result.log_marginal == -np.inf
        assert steps == list(range(1, max(lengths) + 1))  # step k asks with k - 1 after [1]
    lm.close()
    assert dead


def test_a_nan_row_is_an_error_not_a_dead_particle():
    """An allowed NaN in a row (an AsyncLM that is not a checked backend) raises ValueError
    naming it; it used to set the particle's weight to 0 silently."""

    class NaNLM(MockLM):
        async def next_token_logprobs(self, token_ids, **options):
            row = np.array(await super().next_token_logprobs(token_ids, **options))
            row[2] = np.nan
            return row

    lm = NaNLM(VOCAB)
    with pytest.raises(ValueError, match="NaN"):
        run_smc(lm, [0], n_particles=2, max_tokens=2, seed=0)
    forbid_c = np.array([True, True, False, True, True])
    assert len(run_smc(lm, [0], n_particles=2, max_tokens=2, seed=0, token_mask=forbid_c).particles)
    lm.close()


def test_arguments_of_the_wrong_type_are_rejected(lm):
    """A fractional or boolean particle count, a boolean ESS threshold, a bare EOS id, an
    ``on_step`` that is not callable, a mask of ids or floats and a bad prompt fail before
    any request, naming the argument."""
    for n_particles in (2.5, True, np.float64(3.0)):
        with pytest.raises(TypeError, match="n_particles"):
            asyncio.run(smc(lm, [0], n_particles=n_particles))
    with pytest.raises(TypeError, match="ess_threshold"):
        asyncio.run(smc(lm, [0], ess_threshold=True))
    with pytest.raises(TypeError, match="eos_token_ids"):
        asyncio.run(smc(lm, [0], eos_token_ids=2))
    with pytest.raises(TypeError, match="on_step must be a function"):
        asyncio.run(smc(lm, [0], on_step=5))
    for mask in ([0, 1, 2, 3, 4], [1, 1, 1, 1, 0.5]):
        with pytest.raises(TypeError, match="token_mask must be booleans"):
            asyncio.run(smc(lm, [0], token_mask=mask))
    for prompt in ([], "hello", [99]):
        with pytest.raises(InvalidContextError):
            asyncio.run(smc(lm, prompt, max_tokens=0))
    assert lm.batches == []


def test_a_failing_request_leaves_no_other_running():
    """When one particle's request fails, smc cancels the others before it raises: no task
    is left queueing forward passes (a bare gather left them running)."""

    class FailsSecond(MockLM):  # step 2's first batch: the other particles' are queued
        def _logprobs_batch(self, contexts, variant):
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls == 2:
                raise RuntimeError("the second batch failed")
            return super()._logprobs_batch(contexts, variant)

    lm = FailsSecond([bytes([b]) for b in range(256)], max_batch_size=1, cache_bytes=0)

    async def scenario():
        with pytest.raises(RuntimeError, match="second batch"):
            await smc(lm, [0], n_particles=4, max_tokens=3, seed=0, eos_token_ids=[])
        left = asyncio.all_tasks() - {asyncio.current_task()}
        calls = lm.calls
        for _ in range(20):
            await asyncio.sleep(0.001)
        return left, lm.calls - calls

    assert asyncio.run(scenario()) == (set(), 0)
    lm.close()


class FixedDraw:
    """An rng whose uniform draw is fixed, for systematic resampling's edge draws."""

    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


def test_systematic_resampling_never_keeps_a_particle_of_weight_zero():
    """At the edges of the uniform draw and of rounding, a particle of weight 0 is never
    kept: a draw of 0 kept a dead first particle, and positions rounding up past the
    cumulative sum went to a dead last one."""
    assert list(systematic_resample(np.array([-np.inf, 0.0, 0.0]), FixedDraw(0.0))) == [1, 1, 2]
    with pytest.raises(ValueError, match="every weight is 0"):
        systematic_resample(np.full(3, -np.inf), FixedDraw(0.5))
    largest = np.nextafter(1.0, 0.0)  # the largest draw random() can make
    for n in range(2, 40):
        log_weights = np.log(np.random.default_rng(n).random(n))
        log_weights[-1] = -np.inf
        for u in (0.0, largest):
            keep = systematic_resample(log_weights, FixedDraw(u))
            assert keep.max() < n - 1 and list(keep) == sorted(keep)
