"""Sequential Monte Carlo over language-model particles.

The target is the language model's distribution over continuations, conditioned on
every token being allowed by ``token_mask`` (a token-level constraint, e.g. no token
containing the letter ``e``: a lipogram): ``π(x) ∝ p(x) · ∏ mask(x_i)``. Particles
propose from the model tempered at ``temperature`` and restricted to allowed tokens,
``q(t) ∝ p(t)^(1/T) · mask(t)``, and carry the exact importance weight
``log p(t) - log q(t)`` of every token they draw. At ``temperature=1`` that increment is
the log of the allowed tokens' probability mass, so a particle that steered around
likely forbidden tokens loses weight; without a mask and at ``temperature=1`` the
proposal is the target and the weights stay equal. Particles are resampled (systematic
resampling) whenever the effective sample size falls below ``ess_threshold *
n_particles``; a particle that draws an EOS token stops. ``log_marginal`` estimates the
log of the target's normalizer, the log probability that the model's own continuation
satisfies the constraint, at every proposal temperature (the weights correct for it), and
``exp(log_marginal)`` is unbiased. A particle reaching a context where the model gives
every allowed token probability 0 gets weight 0; if every particle does, the estimate is
0 (``log_marginal`` is ``-inf``), which keeps the average over runs unbiased.

All particles of a step ask for their next-token distribution at once, so the model's
scheduler evaluates them as one batch. (One task per particle rather than one
``batch_next_token_logprobs`` call: the batch call saves the tasks but stacks the rows
into one array, a copy that costs more than the tasks at real vocabulary sizes;
``benchmarks/results/core.md`` measures both.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import numpy as np
from scipy.special import logsumexp

from genlm.core._gather import gather_all
from genlm.core._protocol import AsyncLM
from genlm.core._sampling import check_sampling_args, eos_id_set, seeded_rng
from genlm.core._validation import check_token_bytes, is_integer, is_real, validate_context
from genlm.core._vocab import Vocabulary


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
        log_marginal: estimate of log Z, the log normalizer of the target (the log
            probability that a model continuation satisfies the mask); ``-inf`` when every
            particle reached weight 0.
        resampled_at: the steps (1-based) after which particles were resampled.
    """

    particles: list[Particle]
    log_marginal: float
    resampled_at: tuple[int, ...] = ()

    @property
    def resampled(self) -> int:
        """How many steps resampled."""
        return len(self.resampled_at)

    @property
    def weights(self) -> np.ndarray:
        """Normalized weights, in particle order (all 0 when every particle has weight 0)."""
        lw = np.array([p.log_weight for p in self.particles], dtype=np.float64)
        if np.isneginf(lw).all():
            return np.zeros_like(lw)
        w = _relative_weights(lw)
        return w / w.sum()

    @property
    def ess(self) -> float:
        """Effective sample size of the final weights, ``1 / sum(w_i^2)``."""
        return effective_sample_size(np.array([p.log_weight for p in self.particles]))


#: Relative slack of the resampling test: weights equal but for rounding (their log
#: increments added in other orders) have an ESS a few ulps below n.
_ESS_RTOL = 1e-9


def _relative_weights(log_weights: np.ndarray) -> np.ndarray:
    """The weights relative to the largest (which is 1), ``exp(lw - max(lw))``; some weight
    must be positive.

    Shifting by the largest log-weight keeps the weights' ratios whatever their magnitude:
    normalizing with ``lw - logsumexp(lw)`` lost ``log n`` to rounding once the log-weights
    were large (a particle that drew a token masked with -1e30), so n equal weights came
    out 1 each instead of 1/n, and their ESS 1/n instead of n.
    """
    lw = np.asarray(log_weights, dtype=np.float64)
    return np.exp(lw - lw.max())


def effective_sample_size(log_weights: np.ndarray) -> float:
    """``1 / sum(w_i^2)`` of the normalized weights, from unnormalized log-weights (0 when
    every weight is 0): ``(sum u)^2 / sum(u^2)`` of the weights ``u`` relative to the
    largest, so n equal weights give exactly n at any magnitude."""
    if np.isneginf(log_weights).all():
        return 0.0
    u = _relative_weights(log_weights)
    return float(u.sum() ** 2 / np.dot(u, u))


def forbid_bytes(vocab: Vocabulary | Sequence[bytes], forbidden: bytes) -> np.ndarray:
    """A token mask allowing exactly the tokens whose bytes contain none of ``forbidden``.

    Forbidding single bytes is exact at the token level: text avoids a byte if and only
    if each of its tokens does. (A multi-byte sequence could straddle two tokens, so it
    cannot be forbidden this way.)

    Args:
        vocab: the model's :class:`~genlm.core.Vocabulary` (``lm.vocab``): its special
            tokens spell no text (their bytes, such as ``b"</s>"``, are only a display
            name), so they stay allowed, EOS among them. A plain list of token bytes
            (``lm.byte_vocab``) is taken as all text.
        forbidden: the bytes no token may contain.

    Raises:
        TypeError: ``forbidden`` is not bytes, or a token of a plain list is not (a ``str``
            would match no byte at all: encode str tokens, or pass ``lm.byte_vocab``).
    """
    if not isinstance(forbidden, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"forbidden must be bytes, e.g. b'e', got {type(forbidden).__name__} {forbidden!r}"
        )
    banned = set(bytes(forbidden))
    if isinstance(vocab, Vocabulary):
        tokens = vocab.tokens
    else:
        tokens = vocab
        check_token_bytes(tokens)
    mask = np.array([banned.isdisjoint(token) for token in tokens], dtype=bool)
    if isinstance(vocab, Vocabulary) and vocab.special_ids:
        mask[sorted(vocab.special_ids)] = True
    return mask


def systematic_resample(log_weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices of the particles to keep, by systematic resampling.

    One uniform draw places ``n`` evenly spaced positions on the cumulative normalized
    weights; particle ``i`` is kept once per position falling in its share. Returns ``n``
    indices in non-decreasing order. A particle of weight 0 has an empty share, so it is
    never kept, whatever the draw and the rounding: a position is placed in the first share
    that ends after it, and one that rounds up to the end goes to the last particle of
    positive weight.
    """
    if np.isneginf(log_weights).all():
        raise ValueError("every weight is 0: there is nothing to resample")
    n = len(log_weights)
    cdf = np.cumsum(_relative_weights(log_weights))
    cdf /= cdf[-1]
    positions = (rng.random() + np.arange(n)) / n
    last = int(np.flatnonzero(np.isfinite(log_weights))[-1])
    return np.minimum(np.searchsorted(cdf, positions, side="right"), last)


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
    token_mask: Sequence[bool] | np.ndarray | None = None,
    on_step: Callable[[int], None] | None = None,
) -> SMCResult:
    """Run SMC from ``prompt`` for at most ``max_tokens`` tokens per particle.

    Args:
        lm: the model; all particles of a step are evaluated as one batch.
        prompt: token ids to continue.
        n_particles: how many particles.
        max_tokens: most tokens per particle; fewer if the prompt and the new tokens
            would pass ``lm.max_context_length`` (where the model has one): particles
            stop with their last token drawn from a context of exactly that length.
        temperature: the proposal's temperature (the target stays the model's).
        ess_threshold: resample when the ESS falls below this fraction of particles.
        eos_token_ids: tokens that end a particle (default ``lm.vocab.eos_token_ids``).
        seed: seeds the proposal draws and resampling.
        token_mask: which token ids a particle may draw (``forbid_bytes`` builds one);
            None allows every token. EOS tokens follow the mask like any other.
        on_step: called after each step with the step number (progress bars).

    Bad arguments raise before any request: ``TypeError`` for one of the wrong type (a
    non-integer ``n_particles``, a mask that is not booleans, a bare int of EOS, an
    ``on_step`` that is not callable), else
    ``ValueError`` (``temperature`` must be > 0 and pass
    :func:`genlm.core.backend.check_temperature`; a mask must allow some token), and the
    prompt's own :class:`~genlm.core.InvalidContextError`. A row holding NaN or ``+inf``
    where the mask allows tokens raises ``ValueError``.
    """
    if not is_integer(n_particles):
        raise TypeError(f"n_particles must be an integer, got {n_particles!r}")
    if n_particles < 1:
        raise ValueError(f"n_particles must be >= 1, got {n_particles}")
    temperature = check_sampling_args(max_tokens, temperature)  # NaN, inf, bools, 2.5 tokens
    if temperature == 0:
        raise ValueError("temperature must be > 0 (SMC proposes by sampling), got 0")
    if not is_real(ess_threshold):
        raise TypeError(f"ess_threshold must be a real number, got {ess_threshold!r}")
    if not 0 <= ess_threshold <= 1:
        raise ValueError(f"ess_threshold must be in [0, 1], got {ess_threshold}")
    mask = None
    if token_mask is not None:
        mask = np.asarray(token_mask)
        if mask.dtype != bool:
            raise TypeError(
                f"token_mask must be booleans (forbid_bytes builds one), got {mask.dtype} values"
            )
        if mask.shape != (len(lm.vocab),):
            raise ValueError(f"token_mask needs {len(lm.vocab)} entries, got shape {mask.shape}")
        if not mask.any():
            raise ValueError("token_mask allows no token")
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step must be a function of the step number, got {on_step!r}")
    eos = eos_id_set(eos_token_ids, lm.vocab.eos_token_ids)
    prompt = list(validate_context(prompt, len(lm.vocab)))
    rng = seeded_rng(seed)
    limit = getattr(lm, "max_context_length", None)
    if limit is not None and len(prompt) <= limit:  # a longer prompt raises at step 1
        # Like sample: stop once the contexts would pass the model's limit (the last
        # token is drawn from a context of exactly the limit) rather than fail.
        max_tokens = min(max_tokens, limit + 1 - len(prompt))
    particles = [Particle([]) for _ in range(n_particles)]
    log_marginal, resampled_at = 0.0, []
    for step in range(max_tokens):
        active = [p for p in particles if not p.done]
        if not active:
            break
        # One failing request cancels the others: no particle's request outlives the run.
        # numpy rows asked for by name: a model whose default form is torch (genlm.backend's
        # facade) is an AsyncLM too.
        rows = await gather_all(
            lm.next_token_logprobs(prompt + p.tokens, output="numpy") for p in active
        )
        for particle, logp in zip(active, rows):
            _extend(particle, logp.astype(np.float64), mask, temperature, eos, rng)
        if on_step is not None:  # the step's draws are made: also before a dead run ends
            on_step(step + 1)
        log_weights = np.array([p.log_weight for p in particles])
        if np.isneginf(log_weights).all():  # Z estimated as 0: no step can change that
            break
        if effective_sample_size(log_weights) < ess_threshold * n_particles * (1 - _ESS_RTOL):
            log_marginal += logsumexp(log_weights) - np.log(n_particles)
            keep = systematic_resample(log_weights, rng)
            particles = [Particle(list(particles[i].tokens), 0.0, particles[i].done) for i in keep]
            resampled_at.append(step + 1)
    log_weights = np.array([p.log_weight for p in particles])
    log_marginal += logsumexp(log_weights) - np.log(n_particles)
    return SMCResult(particles, float(log_marginal), tuple(resampled_at))


def _extend(
    particle: Particle,
    logp: np.ndarray,
    mask: np.ndarray | None,
    temperature: float,
    eos: set[int],
    rng: np.random.Generator,
) -> None:
    """Draw one token from the masked, tempered proposal and update the particle's weight.

    A particle whose allowed tokens all have probability 0 gets weight 0 (log -inf) and
    stops: it cannot reach the target. The allowed log-probabilities are shifted to a
    maximum of 0 before dividing, so a tiny temperature cannot overflow them all to -inf.

    Raises:
        ValueError: an allowed entry of the row is NaN or ``+inf`` (no weight is right).
    """
    allowed = logp if mask is None else np.where(mask, logp, -np.inf)
    top = allowed.max()  # NaN if any allowed entry is
    if not np.isfinite(top):
        if top == -np.inf:
            particle.log_weight, particle.done = -np.inf, True
            return
        raise ValueError(
            f"the model returned log-probabilities holding {'NaN' if np.isnan(top) else '+inf'}"
            f" after {len(particle.tokens)} new tokens"
        )
    with np.errstate(over="ignore"):  # -inf: a probability below float64's range
        logq = (allowed - top) / temperature
    logq -= logsumexp(logq)
    token = int(np.argmax(logq + rng.gumbel(size=logq.shape)))
    particle.tokens.append(token)
    particle.log_weight += logp[token] - logq[token]
    particle.done = token in eos
