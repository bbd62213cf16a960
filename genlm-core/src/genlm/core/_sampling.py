"""Drawing a token from log-probabilities, exactly and reproducibly.

The checks reject sampling arguments that would silently misbehave (a NaN temperature
draws token 0), before any work is done: one check for every sampler (core's
``sample``/``batch_sample``, ``smc``, genlm-bytes, and backends that sample natively such
as vLLM). A temperature is ``0`` (greedy) or a finite real from :data:`MIN_TEMPERATURE`
up; ``max_tokens`` an integer >= 0. A value of the wrong type (a bool, ``2.5`` tokens,
``"3"``) raises ``TypeError``, a value out of range ``ValueError``.
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np

from genlm.core._validation import is_integer, is_real

_T = TypeVar("_T")

#: The smallest positive temperature, about ``5.6e-309``: below it ``1 / temperature``
#: overflows float64.
MIN_TEMPERATURE = math.nextafter(1 / sys.float_info.max, 1)


def check_sampling_args(max_tokens: object, temperature: object) -> float:
    """Reject a bad ``max_tokens`` or ``temperature`` (see the module); the temperature
    as a float (:func:`check_temperature`)."""
    if not is_integer(max_tokens):
        raise TypeError(
            f"max_tokens must be an integer, got {max_tokens!r} ({type(max_tokens).__name__})"
        )
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    return check_temperature(temperature)


def check_temperature(temperature: object) -> float:
    """Reject a bad ``temperature`` (see the module); return it as a float.

    Every real number is taken (a ``Fraction``, a numpy scalar); the samplers divide
    float64 arrays by the float returned (by a ``Fraction`` numpy would make an array of
    Python objects).

    A positive temperature so small that its reciprocal overflows (a subnormal such as
    ``1e-310``) is refused too, with a message saying so: dividing by it turns every
    log-probability into ``-inf``. The samplers (``sample``, ``smc``, genlm-bytes) shift
    the row to a maximum of 0 before dividing, so any temperature accepted here draws
    exactly (a tiny one among the most likely tokens).
    """
    if not is_real(temperature):
        raise TypeError(
            f"temperature must be a real number, got {temperature!r} ({type(temperature).__name__})"
        )
    try:
        finite = math.isfinite(temperature)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite or temperature < 0:
        raise ValueError(f"temperature must be finite and >= 0 (0 is greedy), got {temperature}")
    if 0 < temperature < MIN_TEMPERATURE:
        raise ValueError(
            f"temperature {temperature} is too small: 1/temperature overflows float64 "
            f"(the smallest is {MIN_TEMPERATURE:.4g}); pass 0 for greedy sampling"
        )
    return float(temperature)


def seeded_rng(seed: object) -> np.random.Generator:
    """numpy's generator for a sampler's ``seed`` (None: fresh entropy).

    Raises:
        TypeError, ValueError: ``seed`` is not None or a non-negative integer (numpy's
            class; its message did not say which argument it was).
    """
    return _seeded(np.random.default_rng, seed)


def seed_streams(seed: object, n: int) -> list[np.random.Generator]:
    """``n`` independent generators from one ``seed``: stream ``i`` of
    ``numpy.random.SeedSequence(seed).spawn(n)``.

    Raises:
        TypeError, ValueError: as :func:`seeded_rng`.
    """
    root = _seeded(np.random.SeedSequence, seed)
    return [np.random.default_rng(s) for s in root.spawn(n)]


def _seeded(make: Callable[[Any], _T], seed: object) -> _T:
    """``make(seed)``; numpy's error about ``seed`` re-raised naming the argument.

    A bool is refused, as every other sampler argument refuses it: numpy would take
    ``True`` as the seed 1.
    """
    if isinstance(seed, bool):
        raise TypeError(f"seed must be None or a non-negative integer, got {seed!r}")
    try:
        return make(seed)
    except (TypeError, ValueError) as error:
        raise type(error)(
            f"seed must be None or a non-negative integer, got {seed!r} ({error})"
        ) from None


def eos_id_set(eos_token_ids: Iterable[int] | None, default: Iterable[int]) -> frozenset[int]:
    """The ids a sampler stops at, read once (an iterator is consumed here, not per prompt):
    ``default`` (the vocabulary's EOS ids) for None. Each id becomes a Python int
    (``operator.index``: numpy and torch integers count): the elements of a torch tensor
    hash by identity, so kept as they are they would never match a drawn token.

    Raises:
        TypeError: a bare int (``eos_token_ids=2``): a list of ids is meant; bytes (each
            byte would be read as a token id: EOS strings are genlm-bytes' ``eos=``); an
            id that is not an integer (a float); or booleans (``[True]`` would be id 1, a
            boolean mask ids 0 and 1).
    """
    if eos_token_ids is None:
        return frozenset(default)
    if isinstance(eos_token_ids, (int, np.integer)) or getattr(eos_token_ids, "ndim", 1) == 0:
        raise TypeError(f"eos_token_ids must be a list of token ids, got {eos_token_ids!r}")
    if isinstance(eos_token_ids, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"eos_token_ids must be token ids, got {type(eos_token_ids).__name__} "
            f"{bytes(eos_token_ids)[:40]!r} (its bytes would be read as ids); "
            "for the id of a token's bytes see lm.vocab"
        )
    ids = list(eos_token_ids)
    if str(getattr(eos_token_ids, "dtype", "")) in ("bool", "torch.bool") or any(
        isinstance(t, (bool, np.bool_)) for t in ids
    ):
        raise TypeError(
            f"eos_token_ids must be integer token ids, got booleans {eos_token_ids!r} (True "
            "would be read as id 1); for a boolean mask over the vocabulary pass "
            "numpy.flatnonzero(mask)"
        )
    try:
        return frozenset(map(operator.index, ids))
    except TypeError:
        raise TypeError(f"eos_token_ids must be integer token ids, got {eos_token_ids!r}") from None


def sample_token(logprobs: np.ndarray, rng: np.random.Generator, temperature: float = 1.0) -> int:
    """Draw a token id from ``softmax(logprobs / temperature)``; ``temperature=0`` is argmax.

    Uses the Gumbel-max trick in float64, so no renormalization is needed and a token's
    chance is exact down to about ``e**-40`` of the most likely token's: float64 uniforms
    bound the Gumbel noise to about [-3.6, 36.7], so a token more than 40.3 nats below the
    best is never drawn (a chance under ``3e-18`` per draw). The row is shifted so its maximum is 0
    before dividing, so a tiny temperature (``1e-308``) cannot overflow every score to
    ``-inf``: it draws among the most likely tokens, as its limit does. ``temperature``
    must satisfy :func:`check_sampling_args`. A row holding NaN or ``+inf``, or only
    ``-inf``, raises ``ValueError`` (``np.argmax`` would silently answer token 0), as does
    anything but one row (``np.argmax`` would answer an index into the flattened array).
    """
    scores = np.asarray(logprobs, dtype=np.float64)
    if scores.ndim != 1:
        raise ValueError(f"cannot sample from log-probabilities of shape {scores.shape}: one row")
    token = int(np.argmax(scores))  # the first NaN if there is one
    best = scores[token]
    if not np.isfinite(best):
        what = "NaN" if np.isnan(best) else "+inf" if best > 0 else "only -inf (no possible token)"
        raise ValueError(f"cannot sample from log-probabilities holding {what}")
    if temperature == 0:
        return token
    with np.errstate(over="ignore"):  # -inf: a probability below float64's range
        scores = (scores - best) / temperature
    scores += rng.gumbel(size=scores.shape)
    return int(np.argmax(scores))
