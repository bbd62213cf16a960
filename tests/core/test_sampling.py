"""Tiny temperatures: refused where 1/temperature overflows, exact above (issue #21, item 7)."""

import asyncio
import math
import sys
from fractions import Fraction

import numpy as np
import pytest

from genlm.core._sampling import sample_token
from genlm.core.backend import check_temperature
from genlm.core.mock import MockLM, mock_logprobs
from genlm.core.smc import smc

VOCAB = [bytes([b]) for b in b"abcdefghijklmnop"]
#: The smallest float whose reciprocal is finite (1 / float max itself rounds to inf's side).
SMALLEST = math.nextafter(1 / sys.float_info.max, 1)


@pytest.mark.parametrize("temperature", [1e-310, 5e-324, math.nextafter(SMALLEST, 0)])
def test_temperatures_whose_reciprocal_overflows_are_refused(temperature):
    """A positive temperature whose reciprocal is inf is a ValueError that says why."""
    assert math.isinf(1 / temperature)
    with pytest.raises(ValueError, match="too small: 1/temperature overflows"):
        check_temperature(temperature)


def test_the_smallest_temperature_is_accepted():
    """MIN_TEMPERATURE is the smallest float whose reciprocal is finite, and it passes."""
    from genlm.core._sampling import MIN_TEMPERATURE

    assert math.isfinite(1 / SMALLEST) and MIN_TEMPERATURE == SMALLEST
    check_temperature(SMALLEST)


def test_sample_and_smc_refuse_a_subnormal_temperature_before_any_work():
    """sample, batch_sample and smc at 1e-310 say "too small" without a forward pass (they
    used to fail after one, as "log-probabilities holding only -inf")."""
    lm = MockLM(VOCAB)
    for call in (
        lm.sample([0], max_tokens=3, eos_token_ids=None, temperature=1e-310, seed=0),
        lm.batch_sample([[0], [1]], max_tokens=3, eos_token_ids=None, temperature=1e-310),
        smc(lm, [0], n_particles=2, max_tokens=3, temperature=1e-310, seed=0),
    ):
        with pytest.raises(ValueError, match="too small"):
            asyncio.run(call)
    assert lm.batch_count == 0
    lm.close()


def test_a_tiny_temperature_draws_uniformly_among_the_most_likely_tokens():
    """At 1e-308 every score of this row used to overflow to -inf (an error); the limit of
    softmax(logp / T) as T -> 0 is uniform over the tied maxima, tokens 3 and 7."""
    probs = np.full(10, 0.76 / 8)
    probs[[3, 7]] = 0.12
    logprobs = np.log(probs)
    with np.errstate(over="ignore"):
        assert np.all(logprobs / 1e-308 == -np.inf)  # what the old division produced
    rng = np.random.default_rng(0)
    draws = np.array([sample_token(logprobs, rng, 1e-308) for _ in range(2000)])
    assert set(draws) == {3, 7}
    assert np.mean(draws == 3) == pytest.approx(0.5, abs=0.05)


def test_a_tiny_temperature_in_smc_follows_the_greedy_path_of_the_allowed_tokens():
    """With a mask that leaves only unlikely tokens, smc at 1e-308 used to kill every
    particle; it now takes the most likely allowed token each step (computed here from
    mock_logprobs), and each weight is the log-probability of that path."""
    first = mock_logprobs([0], len(VOCAB))
    mask = first < -2.5  # the allowed tokens' best is below -1.8: logp / 1e-308 overflows
    with np.errstate(over="ignore"):
        assert np.all(first[mask] / 1e-308 == -np.inf)
    path, logp_path = [], 0.0
    for _ in range(4):
        row = np.where(mask, mock_logprobs([0, *path], len(VOCAB)), -np.inf)
        path.append(int(np.argmax(row)))
        logp_path += row[path[-1]]
    lm = MockLM(VOCAB)
    result = asyncio.run(
        smc(lm, [0], n_particles=3, max_tokens=4, temperature=1e-308, token_mask=mask, seed=0)
    )
    lm.close()
    assert [p.tokens for p in result.particles] == [path] * 3
    for particle in result.particles:
        assert particle.log_weight == pytest.approx(logp_path, abs=1e-5)
    assert result.log_marginal == pytest.approx(logp_path, abs=1e-5)


class _Id:
    """An integer-like id that hashes by identity, as a torch tensor's elements do."""

    def __init__(self, value: int):
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_eos_ids_stop_a_draw_whatever_integers_they_are():
    """EOS ids given as numpy integers or integer-like objects hashing by identity (a torch
    tensor's elements) stop a draw as Python ints do; a float id is a TypeError."""
    lm = MockLM(VOCAB)
    greedy = asyncio.run(lm.sample([0], 6, [], temperature=0))
    eos = greedy[2]
    expected = greedy[: greedy.index(eos) + 1]
    for ids in ([eos], np.array([eos]), [_Id(eos)]):
        assert asyncio.run(lm.sample([0], 6, ids, temperature=0)) == expected, ids
    with pytest.raises(TypeError, match="integer token ids"):
        asyncio.run(lm.sample([0], 6, [float(eos)]))
    with pytest.raises(TypeError, match="list of token ids"):
        asyncio.run(lm.sample([0], 6, np.int64(eos)))
    lm.close()


def test_boolean_eos_ids_are_refused_before_any_work():
    """Booleans are not EOS ids: ``[True]`` was read as id 1 and a boolean mask over the
    vocabulary as ids 0 and 1. sample, batch_sample and smc refuse them (a list of bools,
    a numpy mask, numpy bools), naming the argument, before any request."""
    lm = MockLM(VOCAB)
    mask = np.zeros(len(VOCAB), dtype=bool)
    mask[3] = True
    for eos in ([True], mask, [np.True_], [3, False]):
        with pytest.raises(TypeError, match="eos_token_ids must be integer token ids, got bool"):
            asyncio.run(lm.sample([0], 6, eos))
        with pytest.raises(TypeError, match="flatnonzero"):
            asyncio.run(lm.batch_sample([[0], [1]], 6, eos))
        with pytest.raises(TypeError, match="eos_token_ids"):
            asyncio.run(smc(lm, [0], eos_token_ids=eos))
    assert lm.batches == []
    greedy = asyncio.run(lm.sample([0], 6, [], temperature=0))
    stop = np.flatnonzero(np.arange(len(VOCAB)) == greedy[1])  # the fix the message names
    assert (
        asyncio.run(lm.sample([0], 6, stop, temperature=0)) == greedy[: greedy.index(greedy[1]) + 1]
    )
    lm.close()


def test_eos_ids_given_as_bytes_are_refused_before_any_work():
    """Bytes are not EOS ids: iterating them gives ints, so ``b"\\x03"`` stopped draws at
    token 3 (the byte read as an id). sample, batch_sample and smc refuse them, in every
    bytes-like form, naming the argument, before any request."""
    lm = MockLM(VOCAB)
    for eos in (b"\x03", bytearray(b"\x03"), memoryview(b"\x03")):
        with pytest.raises(TypeError, match="eos_token_ids must be token ids, got"):
            asyncio.run(lm.sample([0], 6, eos))
        with pytest.raises(TypeError, match="eos_token_ids"):
            asyncio.run(lm.batch_sample([[0], [1]], 6, eos))
        with pytest.raises(TypeError, match="eos_token_ids"):
            asyncio.run(smc(lm, [0], eos_token_ids=eos))
    assert lm.batches == []
    lm.close()


def test_bad_seeds_are_refused_naming_the_seed_before_any_work():
    """A negative or fractional seed is numpy's ValueError or TypeError, now saying it is
    the seed (numpy's own message named no argument), from sample, batch_sample and smc; a
    bool too (numpy took True as the seed 1); a valid seed still reproduces its draw."""
    lm = MockLM(VOCAB)
    for seed, error in ((-1, ValueError), (1.5, TypeError), ("7", TypeError), (True, TypeError)):
        with pytest.raises(error, match="seed must be None or a non-negative integer"):
            asyncio.run(lm.sample([0], 4, seed=seed))
        with pytest.raises(error, match="seed must be None"):
            asyncio.run(lm.batch_sample([[0], [1]], 4, seed=seed))
        with pytest.raises(error, match="seed must be None"):
            asyncio.run(smc(lm, [0], seed=seed))
    assert lm.batches == []
    assert asyncio.run(lm.sample([0], 4, seed=3)) == asyncio.run(lm.sample([0], 4, seed=3))
    lm.close()


def test_a_fraction_temperature_draws_as_its_float():
    """A temperature of any real type (a ``Fraction``, a numpy float) draws what its float
    draws, in sample and smc (smc divided float64 rows by the Fraction: an array of Python
    objects, and numpy's exp failed on it)."""
    lm = MockLM(VOCAB)
    for temperature in (Fraction(1, 2), np.float32(0.5)):
        got = asyncio.run(lm.sample([0], 6, eos_token_ids=[], temperature=temperature, seed=4))
        assert got == asyncio.run(lm.sample([0], 6, eos_token_ids=[], temperature=0.5, seed=4))
        runs = [
            asyncio.run(smc(lm, [0], n_particles=3, max_tokens=4, temperature=t, seed=4))
            for t in (temperature, 0.5)
        ]
        assert runs[0].particles == runs[1].particles  # tokens and log weights
        assert runs[0].log_marginal == runs[1].log_marginal
    lm.close()
