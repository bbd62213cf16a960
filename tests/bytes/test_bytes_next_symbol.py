"""The next-symbol distribution against brute force over tokenizations, EOS strings included.

Regression for issue 12 item 1: with a text EOS (``eos=[b"\\n\\n"]``) the beam committed
the ``b"\\n\\n"`` token as text from the LM's raw row while the masses counted it as EOS,
so the next-symbol masses summed to 3.18.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.bytes_lms import brute_force_next_symbol, run

from genlm.bytes import ByteLM
from genlm.core import Vocabulary
from genlm.core.mock import MockLM


async def _check_states(lm: MockLM, eos: list[bytes], context: tuple[int, ...], data: bytes):
    """At each prefix of ``data`` (stepping with ``advance``): brute force, and a sum of 1."""
    byte_lm = ByteLM(lm, K=None, eos=eos)
    eos_ids = set(byte_lm.eos_ids)
    state = await byte_lm.initial(context)
    for i in range(len(data) + 1):
        expected = brute_force_next_symbol(lm, context, data[:i], eos_ids)
        dist = await state.logp_next()
        got = np.exp(dist.logprobs)
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
        # Every token is text or EOS here, so nothing is lost to special tokens; the
        # mock's rows are float32 (core's dtype), hence the tolerance.
        assert got.sum() == pytest.approx(1.0, abs=1e-5)
        if i < len(data):
            state = await state.advance(data[i])


# No BOS: the context is a token id, so every token id is text or EOS.
TOKENS = (b"\n", b"\n\n", b"a", b"\n\na")


def test_text_eos_is_not_also_committed_as_text():
    """Issue 12.1: after b'a\\n\\n' with eos=[b'\\n\\n'] the masses sum to 1 (was 3.18)."""

    async def scenario():
        async with MockLM(Vocabulary(TOKENS)) as lm:
            await _check_states(lm, [b"\n\n"], (2,), b"a\n\na\n\n\n")

    run(scenario())


def test_atomic_and_text_eos_together():
    """A special EOS token and a text EOS string at once, on the same brute force."""
    tokens = (b"</s>", *TOKENS, b"aa")
    vocab = Vocabulary(tokens, special_ids={0}, eos_token_ids=(0,))

    async def scenario():
        async with MockLM(vocab, seed=3) as lm:
            await _check_states(lm, [b"</s>", b"\n\n", b"aa"], (3,), b"aa\n\naa\n")

    run(scenario())


_ALPHABET = b"a\n"
_pieces = st.binary(min_size=2, max_size=3).map(
    lambda b: bytes(_ALPHABET[x % len(_ALPHABET)] for x in b)
)


@st.composite
def _problems(draw):
    """A small vocabulary over two bytes (every single byte a token, so all bytes reach),
    some EOS strings among its tokens, a seed, and bytes to step through."""
    longer = draw(st.lists(_pieces, min_size=1, max_size=5, unique=True))
    tokens = (b"</s>", b"a", b"\n", *longer)
    # </s> is always EOS: a special token that is not would take mass from the bytes.
    text_eos = draw(st.lists(st.sampled_from(longer), min_size=1, max_size=2, unique=True))
    eos = [b"</s>", *text_eos]
    # Bytes made of tokens around a text EOS string (where the double count happened).
    words = st.lists(st.sampled_from(tokens[1:]), max_size=2)
    data = (b"".join(draw(words)) + draw(st.sampled_from(text_eos)) + b"".join(draw(words)))[:7]
    return tokens, eos, draw(st.integers(0, 2**16)), data


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_problems())
def test_next_symbol_matches_brute_force_on_random_vocabularies(problem):
    """Any small vocabulary and EOS strings: every state's distribution is the brute force."""
    tokens, eos, seed, data = problem
    vocab = Vocabulary(tokens, special_ids={0}, eos_token_ids=(0,))

    async def scenario():
        async with MockLM(vocab, seed=seed) as lm:
            await _check_states(lm, eos, (1,), data)

    run(scenario())
