"""Sequential Monte Carlo over language-model particles.

The target is the language model's own distribution over continuations; particles
propose from the model tempered at ``temperature`` (``q ∝ p^(1/T)``) and carry the
importance weight ``log p(x) - log q(x)`` of every token they draw. With
``temperature=1`` the proposal is exact and the weights stay equal. Particles are
resampled (systematic resampling) whenever the effective sample size falls below
``ess_threshold * n_particles``; a particle that draws an EOS token stops.

All particles of a step ask for their next-token distribution at once, so the model's
scheduler evaluates them as one batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import attrs
import numpy as np
from scipy.special import logsumexp

from genlm.core._protocol import AsyncLM


@attrs.define
class Particle:
    """One continuation and its log importance weight."""

    tokens: list[int]
    log_weight: float = 0.0
    done: bool = False


@attrs.frozen
class SMCResult:
    """The particles after the last step.

    Attributes:
        particles: final particles (weights not normalized).
        log_marginal: estimate of log Z, the log normalizer of the target relative to the
            proposal (0 in expectation of exp for an exact proposal).
        resampled: how many steps resampled.
    """

    particles: list[Particle]
    log_marginal: float
    resampled: int

    @property
    def weights(self) -> np.ndarray:
        """Normalized weights, in particle order."""
        lw = np.array([p.log_weight for p in self.particles], dtype=np.float64)
        return np.exp(lw - logsumexp(lw))


def effective_sample_size(log_weights: np.ndarray) -> float:
    """``1 / sum(w_i^2)`` for normalized weights, computed in log space."""
    lw = log_weights - logsumexp(log_weights)
    return float(np.exp(-logsumexp(2 * lw)))


def systematic_resample(log_weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices of the particles to keep, by systematic resampling."""
    n = len(log_weights)
    w = np.exp(log_weights - logsumexp(log_weights))
    positions = (rng.random() + np.arange(n)) / n
    return np.minimum(np.searchsorted(np.cumsum(w), positions), n - 1)


async def smc(
    lm: AsyncLM,
    prompt: Sequence[int],
    *,
    n_particles: int = 8,
    max_tokens: int = 32,
    temperature: float = 1.0,
    ess_threshold: float = 0.5,
    eos_token_ids: Sequence[int] | None = None,
    seed: int | None = None,
    on_step: Callable[[int], None] | None = None,
) -> SMCResult:
    """Run SMC from ``prompt`` for at most ``max_tokens`` tokens per particle.

    Args:
        on_step: called after each step with the step number (progress bars).
    """
    if n_particles < 1:
        raise ValueError(f"n_particles must be >= 1, got {n_particles}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0 <= ess_threshold <= 1:
        raise ValueError(f"ess_threshold must be in [0, 1], got {ess_threshold}")
    rng = np.random.default_rng(seed)
    eos = set(lm.vocab.eos_token_ids if eos_token_ids is None else eos_token_ids)
    prompt = list(prompt)
    particles = [Particle([]) for _ in range(n_particles)]
    log_marginal, resampled = 0.0, 0
    for step in range(max_tokens):
        active = [p for p in particles if not p.done]
        if not active:
            break
        rows = await asyncio.gather(*(lm.next_token_logprobs(prompt + p.tokens) for p in active))
        for particle, logp in zip(active, rows):
            logp = logp.astype(np.float64)
            logq = logp / temperature
            logq -= logsumexp(logq)
            token = int(np.argmax(logq + rng.gumbel(size=logq.shape)))
            particle.tokens.append(token)
            particle.log_weight += logp[token] - logq[token]
            particle.done = token in eos
        log_weights = np.array([p.log_weight for p in particles])
        if effective_sample_size(log_weights) < ess_threshold * n_particles:
            log_marginal += logsumexp(log_weights) - np.log(n_particles)
            keep = systematic_resample(log_weights, rng)
            particles = [Particle(list(particles[i].tokens), 0.0, particles[i].done) for i in keep]
            resampled += 1
        if on_step is not None:
            on_step(step + 1)
    log_weights = np.array([p.log_weight for p in particles])
    log_marginal += logsumexp(log_weights) - np.log(n_particles)
    return SMCResult(particles, float(log_marginal), resampled)
