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
from support.bytes_lms import FixedLM, brute_force_next_symbol, run

from genlm.bytes import ByteLM, UnreachableByteError
from genlm.core import Vocabulary
from genlm.core.mock import MockLM, mock_logprobs


async def _check_states(
    lm: MockLM, eos: list[bytes], context: tuple[int, ...], data: bytes, prompt: int = 0
):
    """At each prefix of ``data`` from ``prompt`` bytes on (prefilled, then stepped with
    ``advance``): brute force, and a sum of 1."""
    byte_lm = ByteLM(lm, K=None, eos=eos)
    eos_ids = set(byte_lm.eos_ids)
    state = await (await byte_lm.initial(context)).prefill(data[:prompt])
    for i in range(prompt, len(data) + 1):
        expected = brute_force_next_symbol(lm, context, data[:i], eos_ids, prompt)
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


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_problems(), st.integers(0, 7))
def test_prefilled_prompt_matches_brute_force_on_random_vocabularies(problem, prompt):
    """Prefilled bytes are text, text EOS strings included (also a prompt's last token),
    and what follows is stepped in EOS mode: every state's distribution is the brute force."""
    tokens, eos, seed, data = problem
    vocab = Vocabulary(tokens, special_ids={0}, eos_token_ids=(0,))

    async def scenario():
        async with MockLM(vocab, seed=seed) as lm:
            await _check_states(lm, eos, (1,), data, min(prompt, len(data)))

    run(scenario())


def test_a_prompt_ending_with_a_text_eos_keeps_its_mass():
    """Issue 21.4: prefilling b'a\n' with eos=[b'\n'] gave no candidate, logZ=-inf and a
    NaN distribution: the switch back to EOS mode dropped the b'\n' token that ends the
    prompt. It is text there, so the state is at the boundary after it."""
    vocab = Vocabulary(
        (b"<s>", b"</s>", b"a", b"\n"), special_ids={0, 1}, bos_token_id=0, eos_token_ids=(1,)
    )

    async def scenario():
        async with MockLM(vocab) as lm:
            state = await ByteLM(lm, K=None, eos=[b"\n"]).initial(b"a\n")
            expected = mock_logprobs((0,), 4)[2] + mock_logprobs((0, 2), 4)[3]
            assert state.logZ == pytest.approx(expected, abs=1e-6)  # float32 rows
            assert [c.context for c in state.candidates] == [(0, 2, 3)]
        # The same prompt after the context b"a" (no BOS, whose mass the sum would miss).
        async with MockLM(Vocabulary(TOKENS)) as lm:
            await _check_states(lm, [b"\n"], (2,), b"\na\n\n", prompt=1)

    run(scenario())


def test_a_prompt_prefilled_in_chunks_counts_its_text_eos_token_once():
    """With b"a" a text EOS token, prefill(b"a") commits the token b"a" as text (a root
    candidate) beside the in-token candidate that leaves it out in EOS mode. A second
    prefill (or with_eos_mode(False)) switched back to text mode, where the in-token
    candidate counts b"a" again, and kept the root candidate too: logZ rose above 0 with
    each empty prefill. P(the bytes start with b"a") = P(a) + P(ab) = 0.7, by hand."""
    vocab = Vocabulary(
        (b"<s>", b"</s>", b"a", b"ab", b"b"),
        special_ids={0, 1},
        bos_token_id=0,
        eos_token_ids=(1,),
    )
    lm = FixedLM(vocab, [0.0, 0.1, 0.6, 0.1, 0.2])

    async def scenario():
        start = await ByteLM(lm, K=None, eos=[b"a"]).initial((0,))
        once = await start.prefill(b"a")
        chunked = await (await start.prefill(b"a")).prefill(b"")
        text = await once.with_eos_mode(False)
        for _ in range(3):
            chunked = await chunked.prefill(b"")
        assert once.logZ == pytest.approx(np.log(0.7), abs=1e-12)
        assert chunked.logZ == pytest.approx(np.log(0.7), abs=1e-12)
        assert text.logZ == pytest.approx(np.log(0.7), abs=1e-12)
        np.testing.assert_allclose(
            (await chunked.logp_next()).logprobs, (await once.logp_next()).logprobs, atol=1e-12
        )

    run(scenario())


def test_a_prompt_ending_inside_a_text_eos_token_is_refused_clearly():
    """A prompt whose last bytes start only a text EOS token (b'\n' of b'\n\n') can only
    be followed by that token, which ends the sequence: initial and with_eos_mode raise
    UnreachableByteError naming the prompt (they gave an empty state and NaN rows)."""
    vocab = Vocabulary(
        (b"<s>", b"</s>", b"a", b"\n\n", b"b"),
        special_ids={0, 1},
        bos_token_id=0,
        eos_token_ids=(1,),
    )

    async def scenario():
        async with MockLM(vocab) as lm:
            byte_lm = ByteLM(lm, K=None, eos=[b"</s>", b"\n\n"])
            with pytest.raises(UnreachableByteError, match=r"prompt b'a\\n'"):
                await byte_lm.initial(b"a\n")
            text = await (await byte_lm.initial((0,))).with_eos_mode(False)
            for byte in b"a\n":
                text = await text.advance(byte)
            assert len(text) == 1  # as text, the partial b'\n' of b'\n\n' goes on
            with pytest.raises(UnreachableByteError, match="eos_mode=True"):
                await text.with_eos_mode(True)
            ended = await byte_lm.initial(b"a\n\n")  # the whole token: text, committed
            assert [c.context for c in ended.candidates] == [(0, 2, 3)]

    run(scenario())


def test_healing_never_commits_a_text_eos_token():
    """Issue 12.1 in healing: re-splitting the partial b'\\n\\na' must not commit the EOS
    token b'\\n\\n' as text (it ends the sequence); it splits b'\\n' + b'\\n' + b'a'."""
    tokens = (b"<s>", b"\n", b"\n\n", b"a", b"b", b"\n\nax")
    vocab = Vocabulary(tokens, special_ids={0}, bos_token_id=0)
    # The same distribution after every context; b"\n\nax" is likely enough that a beam
    # of width 1 keeps the partial b"\n\na", which cannot take b"b": healing runs.
    lm = FixedLM(vocab, [0.0, 0.1, 0.1, 0.1, 0.1, 0.5])

    async def scenario():
        state = await ByteLM(lm, K=1, eos=[b"\n\n"]).initial((0,))
        for b in b"\n\na":
            state = await state.advance(b)
        assert [c.context for c in state.candidates] == [(0,)]  # inside b"\n\nax"
        healed = await state.advance(ord("b"))
        assert [c.context for c in healed.candidates] == [(0, 1, 1, 3)]
        p = 0.1 / 0.9  # FixedLM normalizes the weights
        assert healed.logZ == pytest.approx(4 * np.log(p), abs=1e-12)  # \n, \n, a, then b

    run(scenario())
