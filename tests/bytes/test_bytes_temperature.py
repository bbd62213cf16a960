"""ByteLM sampling refuses a temperature whose reciprocal overflows (issue #21, item 7)."""

import asyncio

import pytest

from genlm.bytes import ByteLM
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
