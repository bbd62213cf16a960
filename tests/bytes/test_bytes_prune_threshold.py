"""``prune_threshold``: a beam at a token boundary keeps its candidates, and a new boundary's
share is counted as genlm-bytes 0.2 counts it (hand-computed weights on a fixed LM)."""

from __future__ import annotations

import numpy as np
import pytest
from support.bytes_lms import FixedLM, run

from genlm.bytes import ByteLM
from genlm.core import Vocabulary

TOKENS = (b"<s>", b"</s>", b"a", b"b", b"ab")
VOCAB = Vocabulary(TOKENS, special_ids={0, 1}, bos_token_id=0, eos_token_ids=(1,))
#: After every context: P(</s>) 0.1, P(a) = P(b) = P(ab) = 0.3.
PROBS = [0.0, 0.1, 0.3, 0.3, 0.3]


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.9])
def test_the_start_of_a_beam_predicts_as_without_a_threshold(threshold):
    """The first state is one candidate at a token boundary, holding the whole mass: no
    threshold below 1 drops it, so its next-byte distribution is the unpruned one (before,
    the candidate was counted twice and a threshold of 0.5 or more emptied the beam)."""

    async def scenario():
        lm = FixedLM(VOCAB, PROBS)
        unpruned = await (await ByteLM(lm, K=None).initial((0,))).logp_next()
        start = await ByteLM(lm, K=None, prune_threshold=threshold).initial((0,))
        pruned = await start.logp_next()
        np.testing.assert_array_equal(pruned.logprobs, unpruned.logprobs)
        # by hand: "a" starts a and ab (0.6), "b" starts b (0.3), EOS 0.1
        assert np.exp(pruned[ord("a")]) == pytest.approx(0.6)
        assert np.exp(pruned[ord("b")]) == pytest.approx(0.3)

    run(scenario())


@pytest.mark.parametrize(
    ("threshold", "kept"), [(0.0, True), (0.4, True), (0.49, True), (0.5, False), (0.6, False)]
)
def test_a_new_boundary_counts_against_the_candidates_that_go_on_with_the_byte(threshold, kept):
    """After "a", stepping by "b": the candidate inside "ab" goes on with weight P(ab) = 0.3;
    the boundary after the token "a" has weight P(a) = 0.3. Its share is 0.3 / (0.3 + 0.3)
    = 0.5, so it is kept below a threshold of 0.5 and dropped from it; kept, it adds
    P(a) P(b) = 0.09 to the mass of "ab"."""

    async def scenario():
        lm = FixedLM(VOCAB, PROBS)
        state = await ByteLM(lm, K=None, prune_threshold=threshold).initial((0,))
        state = await (await state.advance(ord("a"))).advance(ord("b"))
        expected = 0.3 + 0.09 if kept else 0.3
        assert np.exp(state.logZ) == pytest.approx(expected, rel=1e-9)
        contexts = {c.context for c in state.candidates}
        assert ((0, 2) in contexts) is kept

    run(scenario())


def test_a_threshold_that_drops_every_candidate_is_an_error_not_nan():
    """After "ab" two tokenizations hold half the mass each (P(a) P(b) = P(ab) = .1); a
    threshold of 0.5 keeps neither, and logp_next says so (it returned NaN rows)."""
    from genlm.bytes import UnreachableByteError

    vocab = Vocabulary(
        (b"<s>", b"</s>", b"a", b"b", b"ab"), special_ids={0, 1}, bos_token_id=0, eos_token_ids=(1,)
    )

    async def scenario():
        lm = FixedLM(vocab, [0.0, 0.25, 0.4, 0.25, 0.1])
        state = await ByteLM(lm, K=None, prune_threshold=0.5).initial((0,))
        state = await state.prefill(b"ab")
        shares = sorted(np.exp([c.weight - state.logZ for c in state.candidates]))
        assert shares == pytest.approx([0.5, 0.5])
        with pytest.raises(UnreachableByteError, match="prune_threshold=0.5 dropped every"):
            await state.logp_next()
        # advance prunes the same beam first: its error names the threshold too.
        with pytest.raises(UnreachableByteError, match="prune_threshold=0.5 dropped every"):
            await state.advance(ord("a"))

    run(scenario())


@pytest.mark.parametrize(("threshold", "reached"), [(0.0, True), (0.4, True), (0.6, False)])
def test_a_byte_the_threshold_made_unreachable_names_the_threshold(threshold, reached):
    """Two tokens spell "a" (P 0.3 each, P(b) 0.2, P(</s>) 0.2, after every context). After
    "a", stepping by "a" again needs a new boundary: each of the two has a share of
    0.3 / 0.6 = 0.5 (nothing goes on inside a token), so below a threshold of 0.5 the state
    after "aa" holds P("aa") = 0.6 * 0.6 = 0.36, and from it the step fails with an error
    naming prune_threshold (it blamed the byte alone, as for a byte no token spells)."""
    from genlm.bytes import UnreachableByteError

    vocab = Vocabulary(
        (b"<s>", b"</s>", b"a", b"a", b"b"), special_ids={0, 1}, bos_token_id=0, eos_token_ids=(1,)
    )

    async def scenario():
        lm = FixedLM(vocab, [0.0, 0.2, 0.3, 0.3, 0.2])
        byte_lm = ByteLM(lm, K=None, prune_threshold=threshold, heal=False)
        state = await (await byte_lm.initial((0,))).advance(ord("a"))
        if reached:
            after = await state.advance(ord("a"))
            assert np.exp(after.logZ) == pytest.approx(0.36, rel=1e-12)
        else:
            with pytest.raises(UnreachableByteError, match="Beam became empty") as info:
                await state.advance(ord("a"))
            assert f"prune_threshold={threshold} dropped 2 new token boundaries" in str(info.value)
        # A byte no token spells is unreachable whatever the threshold: not blamed on it.
        with pytest.raises(UnreachableByteError, match="Beam became empty") as info:
            await state.advance(ord("c"))
        assert "prune_threshold" not in str(info.value)

    run(scenario())
