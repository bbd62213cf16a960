"""``LazyTrieState.initial``, ``get_EOT`` and ``extend`` (genlm-bytes 0.2's documented
methods of a single candidate) and ``extend_all`` (released 0.2.0's), checked against
brute force over the vocabulary.

The vocabulary has two ids spelling ``b"ab"`` (how a state folds them is the point of
:func:`test_extend_weight_is_the_tokens_probability`) and a text EOS string ``b"."``.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.bytes_lms import run

from genlm.bytes import (
    AsyncTokenByteTrie,
    BeamParams,
    ByteBeamState,
    LazyTrieState,
    TokenByteTrie,
    TrieMode,
)
from genlm.core import TokenByteTrie as CoreTrie
from genlm.core import Vocabulary
from genlm.core.mock import MockLM

TOKENS = (b"<s>", b"</s>", b"a", b"b", b"c", b".", b"ab", b"ba", b"abc", b"bc", b".a", b"ab")
VOCAB = Vocabulary(TOKENS, special_ids={0, 1}, bos_token_id=0, eos_token_ids=(1,))
EOS_STRINGS = [b"</s>", b"."]
TEXT_IDS = range(2, len(TOKENS))
#: Every partial token a state can hold: each non-empty prefix of a text token.
PARTIALS = sorted({TOKENS[t][:n] for t in TEXT_IDS for n in range(1, len(TOKENS[t]) + 1)})


def ids_spelling(partial: bytes) -> list[int]:
    """The text ids whose bytes are ``partial``, from the vocabulary alone."""
    return [t for t in TEXT_IDS if TOKENS[t] == partial]


def row(lm: MockLM, context: tuple[int, ...]) -> np.ndarray:
    """The LM's next-token log-probabilities after ``context``, float64."""
    return np.asarray(lm.next_token_logprobs_sync(list(context)), dtype=np.float64)


def context_logp(lm: MockLM, context: tuple[int, ...]) -> float:
    """log P(context[1:] | BOS), summed from the LM's rows."""
    return sum(row(lm, context[:i])[context[i]] for i in range(1, len(context)))


def trie() -> AsyncTokenByteTrie:
    """The 0.2 trie a program would make for :data:`VOCAB`."""
    return AsyncTokenByteTrie.from_vocab(list(TOKENS), eos_tokens=EOS_STRINGS)


async def walk(state: LazyTrieState, data: bytes) -> LazyTrieState:
    """``state`` (materialized) after the bytes of ``data`` inside its partial token."""
    for b in data:
        state = state << b
    return state


@pytest.mark.parametrize("mode", list(TrieMode))
def test_get_eot_is_none_exactly_where_no_token_ends(mode):
    """``get_EOT()`` is None exactly at the root and at partials no text token equals,
    else the lowest id spelling the partial; it needs no masses, in either mode."""

    async def scenario():
        async with MockLM(VOCAB) as lm:
            start = LazyTrieState.initial(lm, trie(), mode)
            assert start.get_EOT() is None  # unmaterialized, at the root: no empty token
            start = await start.materialize()
            for partial in PARTIALS:
                state = await walk(start, partial)
                expected = ids_spelling(partial)
                assert state.partial == partial
                assert state.get_EOT() == (min(expected) if expected else None), partial
            assert (await walk(start, b"ab")).get_EOT() == 6  # 6 and 11 spell it

    run(scenario())


@pytest.mark.parametrize("mode", list(TrieMode))
def test_extend_weight_is_the_tokens_probability(mode):
    """After a committed token, ``extend()`` of each whole partial has weight
    ``log P(context) + log P(token | context)`` from the LM's rows (both ids of ``b"ab"``
    summed, the heavier appended; ``extend_all()`` one state per id, each its own); None
    (no states) where no token ends, and for the text EOS token ``b"."`` in ``WITH_EOS``
    mode (it cannot end as text there)."""

    async def scenario():
        async with MockLM(VOCAB, seed=5) as lm:
            start = await LazyTrieState.initial(lm, trie(), mode).materialize()
            after_a = await (await walk(start, b"a")).extend().materialize()
            context = after_a.candidate.context
            assert context == (0, 2)
            base = context_logp(lm, context)
            assert after_a.weight == pytest.approx(base, abs=1e-12)
            probs = row(lm, context)
            for partial in PARTIALS:
                state = await walk(after_a, partial)
                ids = ids_spelling(partial)
                if mode is TrieMode.WITH_EOS:
                    ids = [t for t in ids if TOKENS[t] not in EOS_STRINGS]
                extended = state.extend()
                each = state.extend_all()
                if not ids:
                    assert extended is None and each == [], partial
                    continue
                assert [s.candidate.context for s in each] == [(*context, t) for t in ids]
                for s, t in zip(each, ids):  # released 0.2.0's extend_all: one state per id
                    assert s.weight == pytest.approx(base + probs[t], abs=1e-12), partial
                    assert s.partial == b"" and s.candidate.next is None
                expected = base + np.logaddexp.reduce(probs[ids])
                assert extended.weight == pytest.approx(expected, abs=1e-12), partial
                heaviest = max(ids, key=lambda t: (probs[t], -t))
                assert extended.candidate.context == (*context, heaviest)
                assert extended.lm_state.context == [*context, heaviest]
                assert extended.weight == pytest.approx(
                    state.weight + state.logp_next.ps[256], abs=1e-12
                )
            assert (await walk(after_a, b".")).get_EOT() == 5  # a whole token either way

    run(scenario())


def test_extended_state_is_a_fresh_boundary_once_materialized():
    """``extend()`` gives a state at the root of a new context, unmaterialized; once
    materialized its ``logp_next`` is brute force over that context's row (bytes by first
    byte of the text tokens, EOS by the EOS tokens), as a fresh state there has it."""

    async def scenario():
        async with MockLM(VOCAB, seed=2) as lm:
            start = await LazyTrieState.initial(lm, trie()).materialize()
            state = await walk(start, b"bc")
            extended = state.extend()
            assert extended.partial == b"" and extended.get_EOT() is None
            assert extended.data == state.data and extended.mode is TrieMode.WITH_EOS
            calls = lm.batch_count
            with pytest.raises(ValueError, match="State is not yet materialized."):
                _ = extended.logp_next
            assert extended.extend() is None  # no token ends at the root: no masses needed
            assert lm.batch_count == calls
            ps = (await extended.materialize()).logp_next.ps
            probs = np.exp(row(lm, (0, 9)))
            expected = np.zeros(258)
            for t in TEXT_IDS:
                if TOKENS[t] not in EOS_STRINGS:
                    expected[TOKENS[t][0]] += probs[t]
            expected[257] = probs[1] + probs[5]  # </s> and the text EOS "."
            np.testing.assert_allclose(np.exp(ps), expected / expected.sum(), atol=1e-12)

    run(scenario())


def test_extend_keeps_the_beams_mass():
    """Over a beam's candidates, the ``extend()`` weights total what
    ``ByteBeamState.extend`` commits (one state per id there, one per candidate here)."""

    async def scenario():
        async with MockLM(VOCAB, seed=3) as lm:
            beam = await ByteBeamState.initial(lm, BeamParams(K=None, eos_tokens=EOS_STRINGS))
            for b in b"bab":
                beam = await (beam << b)
            ours = [s.extend() for s in beam]
            ours = [s.weight for s in ours if s is not None]
            theirs = [s.weight for s in await beam.extend(beam.logZ)]
            assert len(theirs) > len(ours) > 1  # "ab" ends as two ids
            total = np.logaddexp.reduce(theirs)
            assert np.logaddexp.reduce(ours) == pytest.approx(total, abs=1e-12)

    run(scenario())


def test_initial_takes_a_published_trie_and_refuses_others():
    """``initial(lm, trie, mode)`` takes either 0.2 trie (EOS strings from it, mode by
    value too): the state after BOS, weight 0, unmaterialized; its beam (with the
    options the docstring names) steps as ``ByteBeamState.initial``'s. Another kind of
    trie, another vocabulary's trie, or a vocabulary without BOS is refused by name."""

    async def scenario():
        async with MockLM(VOCAB, seed=1) as lm:
            for made in (trie(), TokenByteTrie(list(TOKENS), eos_tokens=EOS_STRINGS)):
                state = LazyTrieState.initial(lm, made, "without_eos")
                assert state.mode is TrieMode.WITHOUT_EOS and state.weight == 0.0
                assert state.lm_state.context == [0] and state.partial == b""
                with pytest.raises(ValueError, match="State is not yet materialized."):
                    _ = state.mass
            state = await LazyTrieState.initial(lm, trie()).materialize()
            params = BeamParams(K=16, heal_max_splits=8, eos_tokens=EOS_STRINGS)
            beam = ByteBeamState([state], params)
            reference = await ByteBeamState.initial(lm, params)
            for b in b"ab.":
                beam, reference = await (beam.prune() << b), await (reference.prune() << b)
                assert beam.logZ == pytest.approx(reference.logZ, abs=1e-12)
                np.testing.assert_array_equal(
                    (await beam.logp_next()).ps, (await reference.logp_next()).ps
                )
            with pytest.raises(TypeError, match=r"AsyncTokenByteTrie or TokenByteTrie"):
                LazyTrieState.initial(lm, CoreTrie(list(TOKENS)))
            with pytest.raises(TypeError, match="token language model"):
                LazyTrieState.initial(object(), trie())
            other = [*TOKENS[:-1], b"zz"]
            with pytest.raises(ValueError, match=r"token 11 is b'ab', in the trie b'zz'"):
                LazyTrieState.initial(lm, TokenByteTrie(other))
            with pytest.raises(ValueError, match="not a valid TrieMode"):
                LazyTrieState.initial(lm, trie(), "sometimes")
        async with MockLM(Vocabulary(TOKENS[1:], special_ids={0})) as no_bos:
            with pytest.raises(ValueError, match="no BOS token"):
                LazyTrieState.initial(no_bos, TokenByteTrie(list(TOKENS[1:])))

    run(scenario())


@pytest.mark.parametrize(
    ("symbol", "says"),
    [
        (257, r"257 is EOS, an outcome of logp_next .* to end the sequence, stop advancing"),
        (256, r"256 is the end of token of logp_next .* with extend\(\)"),
        (300, "expected a byte value 0..255, got 300"),
        (-1, "expected a byte value 0..255, got -1"),
        (97.0, "expected a byte value 0..255, got 97.0"),
        ("a", "expected a byte value 0..255, got 'a'"),
    ],
    ids=repr,
)
def test_a_symbol_that_is_not_a_byte_is_refused_saying_what_it_is(symbol, says):
    """``state << 257`` (EOS in the 0.2 layout of logp_next) said "edge label 257 is not a
    byte (0..255) or EOS_EDGE (256)", the trie's internals; EOS is an outcome here, never a
    state, so the error says how to end instead, at the root (where EOS has mass) and inside
    a token alike. A byte still steps."""

    async def scenario():
        async with MockLM(VOCAB) as lm:
            state = await LazyTrieState.initial(lm, trie()).materialize()
            assert state.logp_next[257] > -np.inf  # EOS is possible at the root here
            inside = state << ord("a")
            for s in (state, inside):
                with pytest.raises(ValueError, match=says):
                    s << symbol
            assert inside.partial == b"a" and (inside << np.uint8(ord("b"))).partial == b"ab"

    run(scenario())
