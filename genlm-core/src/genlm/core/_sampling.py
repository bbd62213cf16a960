"""Drawing a token from log-probabilities, exactly and reproducibly."""

from __future__ import annotations

import math
import numbers

import numpy as np


def check_sampling_args(max_tokens: object, temperature: object) -> None:
    """Reject sampling arguments that would silently misbehave, before any work is done.

    One check for every sampler: core's ``sample``/``batch_sample``, ``smc``, and backends
    that sample natively (vLLM).

    Args:
        max_tokens: the most tokens to draw.
        temperature: the sampling temperature.

    Raises:
        TypeError: ``max_tokens`` is not an integer (``2.5``, ``True``, ``"3"``), or
            ``temperature`` is not a real number (or is a bool).
        ValueError: ``max_tokens`` is negative, or ``temperature`` is negative, NaN or
            infinite (``temperature=0`` is greedy).
    """
    if isinstance(max_tokens, (bool, np.bool_)) or not isinstance(max_tokens, numbers.Integral):
        raise TypeError(
            f"max_tokens must be an integer, got {max_tokens!r} ({type(max_tokens).__name__})"
        )
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    check_temperature(temperature)


def check_temperature(temperature: object) -> None:
    """Reject a sampling temperature that would silently misbehave (NaN draws token 0).

    Args:
        temperature: the value to check; ``0`` (greedy) and any finite positive real pass.

    Raises:
        TypeError: ``temperature`` is not a real number, or is a bool.
        ValueError: ``temperature`` is negative, NaN or infinite.
    """
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, numbers.Real):
        raise TypeError(
            f"temperature must be a real number, got {temperature!r} ({type(temperature).__name__})"
        )
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be finite and >= 0 (0 is greedy), got {temperature}")


def sample_token(logprobs: np.ndarray, rng: np.random.Generator, temperature: float = 1.0) -> int:
    """Draw a token id from ``softmax(logprobs / temperature)``; ``temperature=0`` is argmax.

    Uses the Gumbel-max trick in float64, so tiny probabilities keep their exact
    chance and no renormalization is needed. ``temperature`` must satisfy
    :func:`check_sampling_args`.

    Raises:
        ValueError: the row holds NaN or ``+inf``, or every token has probability zero
            (``np.argmax`` would otherwise silently answer token 0). Checked on the
            winning score only, so it costs nothing extra.
    """
    if temperature == 0:
        scores = np.asarray(logprobs, dtype=np.float64)
    else:
        scores = np.asarray(logprobs, dtype=np.float64) / temperature
        scores = scores + rng.gumbel(size=scores.shape)
    token = int(np.argmax(scores))  # the first NaN if there is one
    best = scores[token]
    if not np.isfinite(best):
        what = "NaN" if np.isnan(best) else "+inf" if best > 0 else "only -inf (no possible token)"
        raise ValueError(f"cannot sample from log-probabilities holding {what}")
    return token
