"""ByteLM sampling refuses a temperature whose reciprocal overflows (issue #21, item 7)."""

import asyncio
from fractions import Fraction

import numpy as np
import pytest

from genlm.bytes import EOS, ByteLM, NextByteLogprobs
from genlm.core._sampling import MIN_TEMPERATURE
from genlm.core.mock import MockLM


def test_a_subnormal_temperature_is_refused_with_a_clear_error():
    """At 1e-310 every byte's log-probability / temperature is -inf; sampling used to fail
    as "no byte and no EOS has positive probability", it now says the temperature is too
    small."""

    async def sample():
        async with ByteLM(MockLM.from_name("stories260K"), K=4, close_lm=True) as byte_lm:
            state = await byte_lm.initial(b"Once upon")
            return await state.sample(3, seed=0, temperature=1e-310)

    with pytest.raises(ValueError, match="temperature 1e-310 is too small"):
        asyncio.run(sample())


@pytest.mark.parametrize("temperature", [MIN_TEMPERATURE, 1e-308, 9e-308])
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_tiny_accepted_temperature_draws_the_most_likely_byte(temperature):
    """Every temperature check_temperature accepts draws: from 5.6e-309 up to about 1e-307
    ``logprob / temperature`` of an unlikely best byte (here P = 1e-3) used to overflow to
    -inf for every symbol, failing as "no byte and no EOS has positive probability" with
    an overflow warning. The draw at a tiny temperature is the limit at 0: the argmax."""
    logprobs = np.full(EOS + 1, np.log(1e-4))
    logprobs[ord("q")] = np.log(1e-3)  # the best, and unlikely
    logprobs[EOS] = -np.inf
    dist = NextByteLogprobs(logprobs, log_eot=-np.inf)
    rng = np.random.default_rng(0)
    assert {dist.sample(rng, temperature) for _ in range(20)} == {ord("q")}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_distribution_with_nothing_possible_refuses_to_draw(temperature):
    """Every symbol at -inf: no draw, at any temperature (greedy used to return byte 0)."""
    dist = NextByteLogprobs(np.full(EOS + 1, -np.inf), log_eot=-np.inf)
    with pytest.raises(ValueError, match="no byte and no EOS has positive probability"):
        dist.sample(np.random.default_rng(0), temperature)


def test_a_tiny_temperature_through_the_byte_lm_is_greedy_decoding():
    """ByteLM sampling at the smallest accepted temperature gives the greedy bytes, also
    where the best next byte is unlikely enough that ``logprob / temperature`` overflows."""

    async def both():
        async with ByteLM(MockLM.from_name("stories260K"), K=4, close_lm=True) as byte_lm:
            state = await byte_lm.initial(b"Once upon")
            greedy = await state.greedy(12)
            tiny = await state.sample(12, seed=0, temperature=MIN_TEMPERATURE)
            # the worst best-byte log-probability on the greedy path
            worst, s = 0.0, state
            for byte in greedy.data:
                worst = min(worst, float(np.max((await s.logp_next()).logprobs)))
                s = await s.advance(byte)
            return greedy, tiny, worst

    greedy, tiny, worst = asyncio.run(both())
    assert worst * (1 / MIN_TEMPERATURE) == -np.inf  # the case that used to fail
    assert (tiny.data, tiny.eos) == (greedy.data, greedy.eos)


def test_a_fraction_temperature_samples_bytes_as_its_float():
    """A ``Fraction`` temperature draws the bytes, and scores them, as its float does: the
    byte LM divided float64 log-probabilities by it (an array of Python objects)."""

    async def draw(temperature):
        async with ByteLM(MockLM.from_name("stories260K"), K=4, close_lm=True) as byte_lm:
            state = await byte_lm.initial(b"Once upon")
            return await state.sample(6, seed=3, temperature=temperature)

    got, want = asyncio.run(draw(Fraction(1, 2))), asyncio.run(draw(0.5))
    assert (got.data, got.logp) == (want.data, want.logp)
