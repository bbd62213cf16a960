"""Sequential Monte Carlo: importance weights, resampling, marginal likelihood."""

import asyncio

import numpy as np
import pytest
from scipy.special import logsumexp

from genlm.core.mock import MockLM, mock_logprobs
from genlm.core.smc import effective_sample_size, smc, systematic_resample

VOCAB = [b"a", b"b", b"c", b"d", b"e"]


def test_exact_proposal_keeps_equal_weights():
    """With temperature 1 the weights stay 0 (up to float32 rounding of the rows)."""
    lm = MockLM(VOCAB)
    result = asyncio.run(smc(lm, [0], n_particles=6, max_tokens=4, seed=1, eos_token_ids=[]))
    assert all(abs(p.log_weight) < 1e-5 for p in result.particles)
    assert result.log_marginal == pytest.approx(0.0, abs=1e-5)
    assert all(len(p.tokens) == 4 for p in result.particles)
    lm.close()


def test_weights_are_log_p_minus_log_q_of_the_drawn_tokens():
    """Without resampling, each weight equals sum(log p - log q) recomputed by hand."""
    lm = MockLM(VOCAB)
    temperature = 2.0
    result = asyncio.run(
        smc(
            lm,
            [0],
            n_particles=5,
            max_tokens=3,
            temperature=temperature,
            ess_threshold=0,
            seed=3,
            eos_token_ids=[],
        )
    )
    for particle in result.particles:
        expected, context = 0.0, [0]
        for token in particle.tokens:
            logp = mock_logprobs(context, 5).astype(np.float32).astype(np.float64)
            logq = logp / temperature - logsumexp(logp / temperature)
            expected += logp[token] - logq[token]
            context.append(token)
        assert particle.log_weight == pytest.approx(expected, abs=1e-9)
    lm.close()


def test_weighted_particles_estimate_the_model_distribution():
    """Importance-weighted first tokens from a tempered proposal match the model's probabilities."""
    lm = MockLM(VOCAB)
    result = asyncio.run(
        smc(
            lm,
            [1],
            n_particles=4000,
            max_tokens=1,
            temperature=3.0,
            ess_threshold=0,
            seed=0,
            eos_token_ids=[],
        )
    )
    estimate = np.zeros(5)
    for particle, weight in zip(result.particles, result.weights):
        estimate[particle.tokens[0]] += weight
    np.testing.assert_allclose(estimate, np.exp(mock_logprobs([1], 5)), atol=0.03)
    lm.close()


def test_eos_stops_a_particle():
    """A particle that draws an EOS token stops growing."""
    lm = MockLM(VOCAB)
    result = asyncio.run(smc(lm, [0], n_particles=8, max_tokens=6, seed=2, eos_token_ids=[1]))
    for p in result.particles:
        assert 1 not in p.tokens[:-1]
        assert len(p.tokens) == 6 or p.tokens[-1] == 1
    lm.close()


def test_resampling_helpers():
    """ESS of equal weights is n; systematic resampling keeps a dominant particle."""
    assert effective_sample_size(np.zeros(10)) == pytest.approx(10)
    keep = systematic_resample(np.log(np.array([1e-9, 1.0, 1e-9])), np.random.default_rng(0))
    assert list(keep) == [1, 1, 1]


def test_bad_arguments_are_rejected():
    """Zero particles or a non-positive temperature is a clear ValueError."""
    lm = MockLM(VOCAB)
    with pytest.raises(ValueError, match="n_particles"):
        asyncio.run(smc(lm, [0], n_particles=0))
    with pytest.raises(ValueError, match="temperature"):
        asyncio.run(smc(lm, [0], temperature=0))
    lm.close()
