"""The published genlm-bytes 0.2 API (issue 13 item 2): the same numbers as ``ByteLM``.

Programs such as genlm-control 0.4.1 do ``from genlm.bytes import ByteBeamState,
BeamParams``, ``await ByteBeamState.initial(llm, params)``, ``prefill``, ``await
(beam.prune() << b)``, ``(await beam.logp_next()).ps`` (258 entries, EOS last), ``logZ``
and ``cleanup``. Each is checked against the project's own ``ByteLM`` path or brute force.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from support.bytes_lms import FixedLM, brute_force_next_symbol, run
from support.imports import modules_loaded_by

from genlm.bytes import (
    EOS,
    BeamParams,
    ByteBeamState,
    ByteLM,
    LazyTrieState,
    StatefulTokenizedLM,
    TrieMode,
)
from genlm.core import InvalidContextError, Vocabulary
from genlm.core.mock import MockLM

TOKENS = (b"<s>", b"</s>", b"a", b"b", b"c", b".", b"ab", b"ba", b"abc", b"bc", b".a")
VOCAB = Vocabulary(TOKENS, special_ids={0, 1}, bos_token_id=0, eos_token_ids=(1,))


@pytest.mark.parametrize("K", [1, 3, None])
def test_seed_calls_give_bytelm_numbers(K):
    """genlm-control's sequence of calls equals ByteLM's beam stepped with ``prune=False``
    (pruning only where the caller asks), with an EOS string that is also text. The prompt
    ends outside any EOS token, where 0.2's end of prefill (the masses kept) and ByteLM's
    (recomputed) agree; test_prefill_keeps_a_begun_eos_token_as_text covers the rest."""

    async def scenario():
        async with MockLM(VOCAB) as lm:
            params = BeamParams(K=K, eos_byte_strings=[b"</s>", b"."])
            seed = await ByteBeamState.initial(lm, params)
            own_lm = ByteLM(lm, K=K, eos=[b"</s>", b"."], heal_max_splits=None)
            own = await own_lm.initial((0,))
            seed = await seed.prefill(b"ab")
            own = await own.prefill(b"ab")
            for b in b".ab.abc":
                assert seed.logZ == pytest.approx(own.logZ, abs=1e-12)
                ps = (await seed.logp_next()).ps
                normalized = (await own.logp_next(prune=False)).normalized()
                np.testing.assert_allclose(ps[:256], normalized[:256], rtol=0, atol=1e-12)
                assert ps[-1] == pytest.approx(normalized[EOS], abs=1e-12)
                seed = await (seed.prune() << b)
                own = await own.prune().advance(b, prune=False)
            assert len(seed) == len(own)
            await seed.cleanup()

    run(scenario())


class SeedBeam:
    """genlm-bytes 0.2's documented beam algorithm, written out over the vocabulary (no
    trie): the independent expectation for :func:`test_seed_beam_prunes_only_when_asked`.

    A candidate is ``(context, partial bytes, log P(context))``; its weight adds the log
    mass of the text tokens that start with the partial. ``<<`` moves every candidate and
    every token boundary of the beam (the tokens equal to a partial) by the byte;
    ``logp_next`` sums over the same candidates and boundaries, as they are (unpruned);
    ``prune`` keeps the ``K`` heaviest. Only ``</s>`` ends the text (it spells no byte).
    """

    def __init__(self, lm, K, candidates):
        self.lm, self.K, self.candidates = lm, K, candidates

    def row(self, ctx):
        return np.exp(np.asarray(self.lm.next_token_logprobs_sync(ctx), dtype=np.float64))

    def mass(self, ctx, partial):
        p = self.row(ctx)
        return sum(p[t] for t in range(2, len(TOKENS)) if TOKENS[t].startswith(partial))

    def weight(self, c):
        ctx, partial, logp = c
        with np.errstate(divide="ignore"):  # a partial no token continues: -inf, dropped
            return logp + np.log(self.mass(ctx, partial)) if partial else logp

    @property
    def logZ(self):
        return np.logaddexp.reduce([self.weight(c) for c in self.candidates])

    def boundaries(self):
        out = []
        for ctx, partial, logp in self.candidates:
            if partial:
                p = self.row(ctx)
                for t in range(2, len(TOKENS)):
                    if TOKENS[t] == partial and p[t] > 0:
                        out.append((ctx + (t,), b"", logp + np.log(p[t])))
        return out

    def shift(self, byte):
        a = bytes([byte])
        moved = [(ctx, partial + a, lp) for ctx, partial, lp in self.candidates if partial]
        moved += [
            (ctx, a, lp) for ctx, partial, lp in self.candidates + self.boundaries() if not partial
        ]
        kept = [c for c in moved if self.weight(c) > -np.inf]
        return SeedBeam(self.lm, self.K, kept)

    def prune(self):
        ranked = sorted(self.candidates, key=self.weight, reverse=True)
        return SeedBeam(self.lm, self.K, ranked[: self.K] if self.K else ranked)

    def next_symbol(self):
        """P(next byte), then P(EOS), normalized over them."""
        out = np.zeros(257)
        for ctx, partial, logp in self.candidates + self.boundaries():
            p = self.row(ctx)
            for t in range(2, len(TOKENS)):
                tok = TOKENS[t]
                if len(tok) > len(partial) and tok.startswith(partial):
                    out[tok[len(partial)]] += np.exp(logp) * p[t]
            if not partial:
                out[256] += np.exp(logp) * p[1]
        return out / out.sum()


@pytest.mark.parametrize("K", [1, 2, 3])
def test_seed_beam_prunes_only_when_asked(K):
    """``<<`` and ``logp_next`` of a 0.2-API state use every candidate it holds (up to a
    step's boundaries more than ``K``), as genlm-bytes 0.2 documents; only ``prune``
    drops. Checked step by step against :class:`SeedBeam`."""

    async def scenario():
        async with MockLM(VOCAB, seed=3) as lm:
            state = await ByteBeamState.initial(lm, BeamParams(K=K, eos_tokens=[b"</s>"]))
            expected = SeedBeam(lm, K, [((0,), b"", 0.0)])
            grew = False
            for b in b"abcab.ba":
                state = await (state.prune() << b)
                expected = expected.prune().shift(b)
                grew |= len(state) > K
                assert len(state) == len(expected.candidates)
                assert state.logZ == pytest.approx(expected.logZ, abs=1e-9)
                ps = (await state.logp_next()).ps
                got = np.exp(np.concatenate([ps[:256], ps[257:]]))
                np.testing.assert_allclose(got, expected.next_symbol(), rtol=1e-9, atol=1e-12)
            assert grew  # the path makes the unpruned beam exceed K: the case at stake

    run(scenario())


def test_initial_fetches_the_start_row_before_it_returns():
    """As 0.2.0's ``initial`` materializes its state, the LM's row after BOS is fetched
    before ``initial`` returns. A client storing the beam ``initial`` returns and then
    prefilling its prompt (genlm-control 0.4.1's ``ByteLLM``) relies on that await: its
    concurrent first calls all wait there, and each gets the prompted row (three of four
    found the stored beam before the prompt was in it)."""
    params = BeamParams(K=3, eos_tokens=[b"</s>"])

    class Client:
        """ByteLLM's first-call pattern: store the beam, then prefill the prompt."""

        def __init__(self, lm):
            self.lm, self.beam = lm, None

        async def row(self):
            if self.beam is None:
                self.beam = await ByteBeamState.initial(self.lm, params)
                self.beam = await self.beam.prefill(b"ab")
            return (await self.beam.logp_next()).ps

    async def scenario():
        lm = MockLM(VOCAB)
        beam = await ByteBeamState.initial(lm, params)
        assert lm.batch_count == 1  # the row after BOS, fetched by initial
        await beam.cleanup()
        alone = await Client(lm).row()
        client = Client(lm)
        rows = await asyncio.gather(*(client.row() for _ in range(4)))
        for row in rows:
            np.testing.assert_array_equal(row, alone)
        # Each of those beams has a model of its own, all over one trie (built once per
        # vocabulary: about 0.5 s at 128k tokens, on the event loop).
        assert client.beam.byte_lm is not beam.byte_lm
        assert client.beam.byte_lm.trie is beam.byte_lm.trie
        other_lm = MockLM(Vocabulary(TOKENS, bos_token_id=0))
        other = await ByteBeamState.initial(other_lm, params)
        assert other.byte_lm.trie is not beam.byte_lm.trie
        await other_lm.aclose()
        await lm.aclose()

    run(scenario())


def test_documented_constructor_makes_a_beam_of_candidates():
    """``ByteBeamState(states, params)`` (positional or by keyword), as documented: a beam
    of some candidates of another, stepping as :class:`SeedBeam` does from them alone."""

    async def scenario():
        async with MockLM(VOCAB, seed=3) as lm:
            params = BeamParams(K=None, eos_tokens=[b"</s>"])
            beam = await ByteBeamState.initial(lm, params)
            for b in b"ab":
                beam = await (beam << b)
            assert len(beam) > 1
            whole = ByteBeamState(states=list(beam), params=beam.params)
            assert whole.logZ == beam.logZ and whole.data == beam.data == b"ab"
            first = list(beam)[0]
            top = ByteBeamState(list(beam)[:1], params)
            assert type(top) is ByteBeamState and len(top) == 1 and top.data == b"ab"
            c = first.candidate
            expected = SeedBeam(lm, None, [(c.context, first.partial, c.logp)])
            assert top.logZ == pytest.approx(expected.logZ, abs=1e-9)
            for b in b"c.":
                top = await top.advance(b)
                expected = expected.shift(b)
                assert type(top) is ByteBeamState
                assert top.logZ == pytest.approx(expected.logZ, abs=1e-9)
                ps = (await top.logp_next()).ps
                got = np.exp(np.concatenate([ps[:256], ps[257:]]))
                np.testing.assert_allclose(got, expected.next_symbol(), rtol=1e-9, atol=1e-12)
            assert top.data == b"abc."

    run(scenario())


def test_documented_constructor_refuses_what_it_cannot_make():
    """Each refusal of ``ByteBeamState(states, params)`` names its cause: no states, states
    that are not candidates or that do not belong together, options other than the model's."""

    async def scenario():
        async with MockLM(VOCAB, seed=3) as lm:
            params = BeamParams(K=None, eos_tokens=[b"</s>"])
            beam = await (await ByteBeamState.initial(lm, params)).advance(ord("a"))
            later = await beam.advance(ord("b"))
            states = list(beam)
            with pytest.raises(ValueError, match="at least one state"):
                ByteBeamState([], params)
            with pytest.raises(TypeError, match="must be a BeamParams"):
                ByteBeamState(states, {"K": None})
            with pytest.raises(TypeError, match="must be LazyTrieState"):
                ByteBeamState(beam.candidates, params)
            with pytest.raises(ValueError, match="different modes"):
                ByteBeamState([states[0], states[0].with_mode(TrieMode.WITHOUT_EOS)], params)
            with pytest.raises(ValueError, match="after different bytes"):
                ByteBeamState([states[0], list(later)[0]], params)
            async with MockLM(VOCAB, seed=4) as other_lm:
                other = await ByteBeamState.initial(other_lm, params)
                with pytest.raises(ValueError, match="different models"):
                    ByteBeamState([*list(other), *states], params)
            with pytest.raises(ValueError, match=r"K=2 \(the model's: None\)"):
                ByteBeamState(states, BeamParams(K=2, eos_tokens=[b"</s>"]))
            with pytest.raises(ValueError, match=r"eos_tokens=\{b'\.'\}"):
                ByteBeamState(states, BeamParams(K=None, eos_tokens=[b"."]))

    run(scenario())


def test_ps_layout_is_the_normalized_brute_force():
    """``ps``: 258 entries, bytes 0..255, end of token (-inf) at 256, EOS at 257 (the last);
    normalized over bytes and EOS, equal to brute force over tokenizations."""

    async def scenario():
        async with MockLM(VOCAB, seed=1) as lm:
            params = BeamParams(K=None, eos_tokens=[b"</s>"])
            state = await ByteBeamState.initial(lm, params)
            for b in b"ab.":
                state = await (state.prune() << b)
            ps = (await state.logp_next()).ps
            assert ps.shape == (258,) and ps.dtype == np.float64
            assert ps[256] == -np.inf
            expected = brute_force_next_symbol(lm, (0,), b"ab.", {1})
            expected /= expected.sum()  # what <s> would take spells no byte
            got = np.exp(np.concatenate([ps[:256], ps[257:]]))
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
            assert np.exp(ps).sum() == pytest.approx(1.0, abs=1e-12)

    run(scenario())


def test_beam_params_accept_both_eos_names():
    """eos_tokens (the docs) and eos_byte_strings (0.2.0) are one option; None means no EOS."""
    assert BeamParams(K=2, eos_tokens=[b"x"]).eos_byte_strings == {b"x"}
    assert BeamParams(K=2, eos_byte_strings=[b"x"]).eos_tokens == {b"x"}
    assert BeamParams(K=2, eos_tokens=[b"x"], eos_byte_strings={b"x"}).eos_tokens == {b"x"}
    assert BeamParams(K=2).eos_tokens == set()
    assert BeamParams(K=2, prune_threshold=0.1).log_prune_threshold == pytest.approx(np.log(0.1))
    with pytest.raises(ValueError, match="eos_byte_strings"):
        BeamParams(K=2, eos_tokens=[b"x"], eos_byte_strings=[b"y"])
    with pytest.raises(TypeError, match="list of byte strings"):
        BeamParams(K=2, eos_tokens=b"\n\n")
    with pytest.raises(ValueError, match="K must be"):
        BeamParams(K=0)
    with pytest.raises(ValueError, match="prune_threshold"):
        BeamParams(K=2, prune_threshold=-0.5)

    async def scenario():
        async with MockLM(VOCAB) as lm:
            state = await ByteBeamState.initial(lm, BeamParams(K=2))
            assert (await state.logp_next()).ps[-1] == -np.inf  # no EOS configured
            assert state.params.K == 2 and state.params.eos_tokens == set()
            with pytest.raises(TypeError, match="token language model"):
                await ByteBeamState.initial(object(), BeamParams(K=2))
            with pytest.raises(TypeError, match="unknown trie option"):
                await ByteBeamState.initial(lm, BeamParams(K=2), trie_opts={"colour": 1})
            ok = await ByteBeamState.initial(lm, BeamParams(K=2), {"max_batch_size": 100})
            assert ok.logZ == 0.0

    run(scenario())


def test_beam_params_is_the_documented_dataclass():
    """BeamParams is a stdlib dataclass (as the docs show and 0.2.0 ships): replace, asdict
    and fields work; a replaced copy is checked again, and replace changes the EOS strings
    by either name."""
    params = BeamParams(K=5, prune_threshold=0.1, eos_byte_strings=[b"."], heal=False)
    assert dataclasses.is_dataclass(params)
    documented = ["K", "prune_threshold", "verbose", "eos_tokens", "heal"]
    documented += ["heal_max_backoff", "heal_max_splits"]
    assert [f.name for f in dataclasses.fields(BeamParams)] == [*documented, "eos_byte_strings"]
    narrower = dataclasses.replace(params, K=3)
    assert (narrower.K, narrower.prune_threshold, narrower.heal) == (3, 0.1, False)
    assert narrower.eos_tokens == narrower.eos_byte_strings == {b"."}
    assert params.K == 5  # replace makes a copy
    for name in ("eos_tokens", "eos_byte_strings"):
        other = dataclasses.replace(params, **{name: [b"\n", b"!"]})
        assert other.eos_tokens == other.eos_byte_strings == {b"\n", b"!"}
    with pytest.raises(ValueError, match="K must be"):
        dataclasses.replace(params, K=0)
    with pytest.raises(ValueError, match="eos_byte_strings"):
        dataclasses.replace(params, eos_tokens=[b"x"], eos_byte_strings=[b"y"])
    as_dict = dataclasses.asdict(params)
    assert as_dict["K"] == 5 and as_dict["eos_tokens"] == {b"."}
    assert BeamParams(**as_dict) == params
    assert repr(params).startswith("BeamParams(K=5, prune_threshold=0.1, verbose=False,")
    assert "eos_tokens={b'.'}" in repr(params)


def test_extend_holds_the_token_boundary_mass():
    """``extend`` commits every token a partial spells: its states' total weight is the
    probability of a boundary here (``log_eot``), each state at the trie root with the
    context's masses."""

    async def scenario():
        async with MockLM(VOCAB) as lm:
            state = await ByteBeamState.initial(lm, BeamParams(K=None, eos_tokens=[b"</s>"]))
            for b in b"ab":
                state = await (state << b)
            dist = await state.logp_next()
            extended = await state.extend(state.logZ)
            contexts = sorted(s.lm_state.context for s in extended)
            # "ab" = a|b or ab (then at a boundary); "b" alone inside "ba"/"bc" is not one.
            assert contexts == [[0, 2, 3], [0, 6]]
            total = np.logaddexp.reduce([s.weight for s in extended])
            assert total - state.logZ == pytest.approx(dist.log_eot, abs=1e-12)
            for s in extended:
                assert s.node == state.byte_lm.trie.root and s.partial == b""
                ctx = tuple(s.lm_state.context)
                row = np.asarray(await lm.next_token_logprobs(ctx), dtype=np.float64)
                starts_with_a = np.logaddexp.reduce(row[[2, 6, 8]])  # a, ab, abc
                assert s.mass[s.actions()[ord("a")]] == pytest.approx(starts_with_a, abs=1e-12)

    run(scenario())


def test_with_mode_and_lazy_trie_states():
    """``with_mode`` switches EOS treatment without an LM call and back; each candidate's
    ``logp_next`` (258) is its masses' ratios."""

    async def scenario():
        async with MockLM(VOCAB) as lm:
            params = BeamParams(K=None, eos_tokens=[b"</s>", b"."])
            state = await ByteBeamState.initial(lm, params)
            state = await (state << ord("."))
            calls = len(lm.batches)
            text = state.with_mode(TrieMode.WITHOUT_EOS)
            back = text.with_mode(TrieMode.WITH_EOS)
            assert len(lm.batches) == calls
            # As 0.2 switches: the label changes, each candidate keeps its masses.
            assert text.logZ == back.logZ == state.logZ
            assert {s.mode for s in text} == {TrieMode.WITHOUT_EOS}
            assert {s.mode for s in back} == {TrieMode.WITH_EOS}
            for s in state:
                assert isinstance(s, LazyTrieState) and s.mode is TrieMode.WITH_EOS
                probs = s.logp_next  # 0.2's LazyByteProbs: ps, [] and materialize
                lp = probs.ps
                assert lp.shape == (258,)
                chart = probs.materialize()
                assert chart[None] == probs[None] == probs[256] == lp[256]  # end of token
                assert chart[257] == probs[257] == lp[257]  # EOS
                assert all(chart[b] == probs[b] == lp[b] for b in range(256))
                assert probs.pretty()[b"a"] == lp[ord("a")]
                for key in (258, -1, 1.0, True):
                    with pytest.raises(ValueError, match="257 .EOS."):
                        probs[key]
                assert np.exp(lp).sum() == pytest.approx(1.0, abs=1e-12)
                for byte, child in s.actions().items():
                    assert lp[byte] == pytest.approx(s.mass[child] - s.mass[s.node], abs=1e-9)
                moved = s << ord("a")
                assert moved.partial == s.partial + b"a"
                assert moved.weight == pytest.approx(s.weight + lp[ord("a")], abs=1e-9)

    run(scenario())


def test_a_candidates_cleanup_leaves_every_state_usable():
    """``LazyTrieState.cleanup`` (0.2 programs may clean up each candidate) empties the
    model's caches and leaves the beam usable, as ``ByteBeamState.cleanup`` does: the next
    step still equals brute force (it closed the whole model)."""

    async def scenario():
        async with MockLM(VOCAB, seed=2) as lm:
            beam = await ByteBeamState.initial(lm, BeamParams(K=None, eos_tokens=[b"</s>"]))
            beam = await beam.prefill(b"ab")
            await beam.logp_next()
            for s in beam.states:
                await s.cleanup()
            assert len(beam.byte_lm.cache) == 0
            beam = await (beam.prune() << ord("c"))
            ps = (await beam.logp_next()).ps
            expected = brute_force_next_symbol(lm, (0,), b"abc", {1})
            expected /= expected.sum()
            got = np.exp(np.concatenate([ps[:256], ps[257:]]))
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)

    run(scenario())


def test_prefill_keeps_a_begun_eos_token_as_text():
    """0.2's prefill ends by switching to EOS mode with the masses kept, so an EOS token the
    prompt began (b" " of the EOS string b" a") may still complete as text; stepping on
    counts new boundaries in EOS mode, and cleanup leaves the states usable. Weights by hand
    on a fixed LM: P(b) = .3, P(" a") = .25, P(" ") = .15, P(a) = .2 after every context."""
    vocab = Vocabulary(
        (b"<s>", b"</s>", b"a", b"b", b" a", b" "),
        special_ids={0, 1},
        bos_token_id=0,
        eos_token_ids=(1,),
    )

    async def scenario():
        lm = FixedLM(vocab, [0.0, 0.1, 0.2, 0.3, 0.25, 0.15])
        state = await ByteBeamState.initial(lm, BeamParams(K=None, eos_byte_strings=[b" a"]))
        state = await state.prefill(b"b ")
        assert np.exp(state.logZ) == pytest.approx(0.3 * (0.25 + 0.15), rel=1e-12)
        assert {s.mode for s in state} == {TrieMode.WITH_EOS}
        await state.cleanup()
        after = await (state.prune() << ord("a"))
        # " a" completes as text (.3 * .25), or " " does and "a" starts anew (.3 * .15 * .2)
        assert np.exp(after.logZ) == pytest.approx(0.3 * 0.25 + 0.3 * 0.15 * 0.2, rel=1e-12)

    run(scenario())


def test_stateful_tokenized_lm():
    """The token context: starts at BOS, ``<<`` appends, ``logp_next`` is the model's row."""

    async def scenario():
        async with MockLM(VOCAB) as lm:
            state = StatefulTokenizedLM.initial(lm)
            assert state.context == [0]
            longer = state << 2 << 3
            assert longer.context == [0, 2, 3] and state.context == [0]
            row = await (StatefulTokenizedLM.initial(lm) << 2 << 3).logp_next()
            np.testing.assert_array_equal(row, await lm.next_token_logprobs((0, 2, 3)))
            short = StatefulTokenizedLM(lm, [0, 2], max_context_length=2) << 3
            assert short.context == [2, 3]
            with pytest.raises(TypeError):
                state << 2.5

    run(scenario())


@pytest.mark.parametrize(
    ("context", "says"),
    [
        ([1.7, 2], "position 0 is 1.7 .float."),
        ([0, "2"], "position 1 is '2' .str."),
        ([0, True], "position 1 is True .bool."),
        ([0, 99], "token id 99 at position 1 is out of range"),
        ([], "empty context"),
    ],
    ids=repr,
)
def test_stateful_tokenized_lm_checks_its_context_as_core_does(context, says):
    """A context of non-integer or out-of-range ids is refused as core (and ByteLM.initial)
    refuses it: int() read [1.7, "2", True] as [1, 2, 1] and asked the model for that."""
    lm = FixedLM(VOCAB, np.ones(len(TOKENS)))
    with pytest.raises(InvalidContextError, match=says):
        StatefulTokenizedLM(lm, context)
    assert StatefulTokenizedLM(lm, np.array([0, 2])).context == [0, 2]


def test_published_import_paths_and_no_torch():
    """The documented module paths hold the same classes, and none of them loads torch."""
    from genlm.bytes.byte_lm.beam import BeamParams as B
    from genlm.bytes.byte_lm.beam import ByteBeamState as S
    from genlm.bytes.byte_lm.lm_state import StatefulTokenizedLM as L
    from genlm.bytes.byte_lm.trie_state import LazyTrieState as T

    assert (B, S, L, T) == (BeamParams, ByteBeamState, StatefulTokenizedLM, LazyTrieState)
    statement = "from genlm.bytes import ByteBeamState, BeamParams; import genlm.bytes.byte_lm.beam"
    assert modules_loaded_by(statement, ["torch"]) == []
