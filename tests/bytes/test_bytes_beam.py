"""Beam behaviour on small controlled models: EOS strings, healing, sampling, batching, cleanup."""

from __future__ import annotations

import asyncio
import re
import threading

import numpy as np
import pytest
from support.bytes_lms import FixedLM, brute_force_prefix_logprob, run

from genlm.bytes import (
    EOS,
    EOT,
    BeamParams,
    ByteBeamState,
    ByteLM,
    ByteLMClosedError,
    NextByteLogprobs,
    UnreachableByteError,
)
from genlm.core import InvalidContextError, Vocabulary
from genlm.core.mock import MockLM

TOKENS = (b"<s>", b"</s>", b"a", b"b", b"c", b".", b"ab", b"ba", b"abc", b"bc", b".a")
VOCAB = Vocabulary(TOKENS, special_ids={0, 1}, bos_token_id=0, eos_token_ids=(1,))
TEXT = set(range(2, len(TOKENS)))


def _mock_row(lm):
    return lambda ctx: np.asarray(lm.next_token_logprobs_sync(ctx), dtype=np.float64)


def test_chain_rule_exact_on_mock():
    """Unpruned on the mock model, chained conditionals equal brute force on a long string."""

    async def scenario():
        async with MockLM(VOCAB, cache_bytes=0) as lm:
            data = b"abcab.ab"
            expected = brute_force_prefix_logprob(_mock_row(lm), VOCAB, (0,), data, TEXT)
            state = await ByteLM(lm, K=None).initial((0,))
            total = 0.0
            for b in data:
                total += (await state.logp_next())[b]
                state = await (state << b)
            assert total == pytest.approx(expected, abs=1e-9)

    run(scenario())


def test_eos_byte_strings_move_mass_to_eos():
    """With eos=[b'</s>', b'.'], P(EOS) is p(</s>) + p('.') and byte '.' keeps only '.a'."""

    async def scenario():
        async with MockLM(VOCAB) as lm:
            row = np.asarray(await lm.next_token_logprobs((0,)), dtype=np.float64)
            state = await ByteLM(lm, K=None, eos=[b"</s>", b"."]).initial((0,))
            dist = await state.logp_next()
            assert dist.eos == pytest.approx(np.logaddexp(row[1], row[5]), abs=1e-9)
            assert dist[ord(".")] == pytest.approx(row[10], abs=1e-9)

    run(scenario())


def test_prefill_counts_text_eos_tokens_as_text():
    """Prefilling through '.' (an EOS string) sums the '.' token too, then restores EOS mode."""

    async def scenario():
        async with MockLM(VOCAB) as lm:
            data = b"ab.ba"
            expected = brute_force_prefix_logprob(_mock_row(lm), VOCAB, (0,), data, TEXT)
            byte_lm = ByteLM(lm, K=None, eos=[b"</s>", b"."])
            state = await (await byte_lm.initial((0,))).prefill(data)
            assert state.logZ == pytest.approx(expected, abs=1e-9)
            assert state.eos_mode

    run(scenario())


def test_unknown_eos_string_is_rejected():
    """An EOS byte string that spells no token raises a ValueError naming it."""
    lm = FixedLM(VOCAB, np.ones(len(TOKENS)))
    with pytest.raises(ValueError, match="b'zz'"):
        ByteLM(lm, eos=[b"zz"])


def test_an_empty_eos_string_is_rejected():
    """b"" spells every unused or special id without bytes (here two padding ids): it was
    taken as EOS, so their mass was reported as P(EOS)."""
    vocab = Vocabulary(TOKENS + (b"", b""), unused_ids={len(TOKENS), len(TOKENS) + 1})
    lm = FixedLM(vocab, np.ones(len(TOKENS) + 2))
    with pytest.raises(ValueError, match="must not be empty"):
        ByteLM(lm, eos=[b"\n", b""])


# "abc" is far likelier than "a" then "b", so with K=1 the beam keeps only the partial
# "ab" of "abc" ("ab" is no token), which cannot continue with "a": healing must re-split.
HEAL_VOCAB = Vocabulary((b"<s>", b"</s>", b"a", b"b", b"c", b"abc"), bos_token_id=0)
HEAL_PROBS = [0, 0, 0.1, 0.1, 0.1, 0.7]


def test_healing_resplits_a_dead_partial_token():
    """With K=1 the beam empties on 'aba'; healing commits 'a' and 'b' and goes on."""

    async def scenario():
        lm = FixedLM(HEAL_VOCAB, HEAL_PROBS)
        state = await (await ByteLM(lm, K=1).initial((0,))).prefill(b"ab")
        assert len(state.prune()) == 1 and state.candidates[0].context == (0,)
        state = await state.advance(ord("a"))
        assert state.data == b"aba"
        best = state.candidates[0]
        assert best.context == (0, 2, 3)  # a, b committed; "a" is the partial token
        # The healed weight is the true mass of its tokenization path: a lower bound.
        exact = brute_force_prefix_logprob(
            lambda ctx: lm._row, HEAL_VOCAB, (0,), b"aba", {2, 3, 4, 5}
        )
        assert state.logZ == pytest.approx(np.log(0.1 * 0.1 * 0.8), abs=1e-12)
        assert state.logZ <= exact + 1e-12
        assert state.logZ <= exact + 1e-12

    run(scenario())


def test_without_healing_a_dead_beam_raises():
    """heal=False: the same step raises UnreachableByteError naming the byte."""

    async def scenario():
        lm = FixedLM(HEAL_VOCAB, HEAL_PROBS)
        state = await (await ByteLM(lm, K=1, heal=False).initial((0,))).prefill(b"ab")
        with pytest.raises(UnreachableByteError, match="b'a'"):
            await state.advance(ord("a"))

    run(scenario())


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ((b"a",), "no token holds b'z'"),
        ((b"a", b"az"), "b'z' only inside a token that starts otherwise"),
        ((b"a", b"z"), "b'z' only as an EOS token"),
    ],
)
def test_healing_asks_the_lm_nothing_for_a_byte_no_spelling_reaches(extra, why):
    """After a run of b"-" (tokens of every length, as gpt2's and llama's vocabularies
    have), a byte that no re-split can spell is unreachable at once: healing tried every
    re-split of the partial run first, one LM context each (239 contexts for 8 dashes,
    50,666 for 16, each a forward pass), before it learned that none spells the byte."""
    dashes = tuple(b"-" * n for n in range(1, 17))
    vocab = Vocabulary((b"<s>", b"</s>") + dashes + extra, special_ids={0, 1}, bos_token_id=0)
    lm = FixedLM(vocab, np.ones(len(vocab)))

    async def scenario():
        eos = [b"z"] if b"z" in extra else None
        state = await (await ByteLM(lm, K=4, eos=eos).initial((0,))).prefill(b"-" * 8)
        before = len(lm.contexts)
        with pytest.raises(UnreachableByteError, match="b'z'"):
            await state.advance(ord("z"))
        assert len(lm.contexts) - before <= 4, why  # at most the beam's own K boundaries

    run(scenario())


def test_seeded_sampling_is_reproducible_and_greedy_is_argmax():
    """The same seed gives the same bytes; greedy takes the argmax at every step."""

    async def scenario():
        async with MockLM(VOCAB) as lm:
            state = await ByteLM(lm, K=4).initial((0,))
            one = await state.sample(12, seed=7)
            two = await state.sample(12, seed=7)
            assert (one.data, one.eos, one.logp) == (two.data, two.eos, two.logp)
            greedy = await state.greedy(6)
            walk = state
            for b in greedy.data:
                assert (await walk.logp_next()).argmax() == b
                walk = await walk.advance(b)
            if greedy.eos:
                assert (await walk.logp_next()).argmax() == EOS

    run(scenario())


def test_sample_reports_each_byte_drawn():
    """``on_step`` is called after each byte drawn with the number drawn so far (the
    progress bar of ``genlm bytes --sample``), and the draws are those made without it."""

    async def scenario():
        async with MockLM(VOCAB) as lm:
            state = await ByteLM(lm, K=4).initial((0,))
            steps = []
            out = await state.sample(12, seed=7, on_step=steps.append)
            assert steps == list(range(1, len(out.data) + 1))
            assert out.data == (await state.sample(12, seed=7)).data

    run(scenario())


@pytest.mark.parametrize("temperature", [1.0, 0.3, 3.0, 0.0])
def test_sampled_logp_is_under_the_distributions_drawn_from(temperature):
    """``GeneratedBytes.logp`` sums each choice's log-probability under the tempered
    distribution it was drawn from (a proposal's weight), computed here by hand from the
    states' own distributions: softmax(logprobs / T); greedy choices have probability 1."""

    async def scenario():
        async with MockLM(VOCAB) as lm:
            state = await ByteLM(lm, K=4).initial((0,))
            out = await state.sample(6, seed=3, temperature=temperature)
            expected, walk = 0.0, state
            for symbol in [*out.data, *([EOS] if out.eos else [])]:
                logprobs = (await walk.logp_next()).logprobs
                if temperature:
                    scaled = logprobs / temperature
                    expected += scaled[symbol] - np.log(np.exp(scaled - scaled.max()).sum())
                    expected -= scaled.max()
                if symbol != EOS:
                    walk = await walk.advance(symbol)
            assert out.logp == pytest.approx(expected, abs=1e-9)

    run(scenario())


def test_a_step_sends_its_boundaries_as_one_batch():
    """All new token boundaries of a step reach the model together (one forward batch)."""

    async def scenario():
        async with MockLM(VOCAB, max_wait_s=0.05, cache_bytes=0) as lm:
            state = await (await ByteLM(lm, K=None).initial((0,))).prefill(b"ab")
            lm.batches.clear()
            await state.logp_next()
            # Boundaries after "ab": a|b, ab  (two contexts, one batch).
            assert len(lm.batches) == 1 and len(lm.batches[0]) == 2

    run(scenario())


def test_cancelled_step_leaves_no_task_and_closed_raises():
    """Cancelling a step mid-flight leaves no pending task; after aclose, steps raise."""

    async def scenario():
        async with MockLM(VOCAB, latency_s=0.2) as lm:
            async with await ByteLM.from_prompt(lm, (0,), K=4) as state:
                task = asyncio.create_task(state.logp_next())
                await asyncio.sleep(0.05)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert asyncio.all_tasks() == {asyncio.current_task()}
            with pytest.raises(ByteLMClosedError):
                await state.logp_next()

    run(scenario())


class _GatedCloseLM(MockLM):
    """A mock whose release (``_close_backend``, on its worker thread) waits for ``gate``
    (10 s at most: nothing hangs), then fails if ``failure`` is set."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.released = False
        self.failure: Exception | None = None

    def _close_backend(self) -> None:
        self.gate.wait(10)
        super()._close_backend()
        self.released = True
        if self.failure is not None:
            raise self.failure


@pytest.mark.parametrize("fails", [False, True])
def test_aclose_after_a_cancelled_aclose_waits_for_the_lms_release(fails):
    """As core's aclose: after a cancelled ``ByteLM(close_lm=True).aclose()``, a later one
    returns only once the token LM is released, and raises what the release raised (it
    returned at once, before the release, and never raised)."""

    async def scenario():
        lm = _GatedCloseLM(VOCAB)
        lm.failure = RuntimeError("release failed") if fails else None
        byte_lm = ByteLM(lm, close_lm=True)
        try:
            first = asyncio.create_task(byte_lm.aclose())
            await asyncio.sleep(0)  # the first aclose has asked the LM to close
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            second = asyncio.create_task(byte_lm.aclose())
            for _ in range(5):
                await asyncio.sleep(0)
            assert not second.done() and not lm.released  # the release waits for the gate
            lm.gate.set()
            if fails:
                with pytest.raises(RuntimeError, match="release failed"):
                    await asyncio.wait_for(second, 10)
            else:
                await asyncio.wait_for(second, 10)
            assert lm.released
            with pytest.raises(ByteLMClosedError):
                await byte_lm.next_tokens([(0,)])
        finally:
            lm.gate.set()

    run(scenario())


def test_bad_inputs_raise_clear_errors():
    """Out-of-range bytes, empty contexts and bad options are rejected with a message."""

    async def scenario():
        lm = FixedLM(VOCAB, np.ones(len(TOKENS)))
        with pytest.raises(ValueError, match="K must be"):
            ByteLM(lm, K=0)
        with pytest.raises(ValueError, match="K must be"):
            ByteLM(lm, K=True)  # as BeamParams: a bool is no beam width
        with pytest.raises(ValueError, match="lookahead must be"):
            ByteLM(lm, lookahead=-1)
        # Wrong types fail at construction too, not at the first step.
        for options in ({"K": 2.5}, {"K": "4"}, {"lookahead": 1.5}, {"heal_max_splits": 2.0}):
            with pytest.raises(ValueError, match=f"{next(iter(options))} must be"):
                ByteLM(lm, **options)
        assert ByteLM(lm, K=np.int64(4)).K == 4  # numpy integers are integers
        with pytest.raises(TypeError, match="device_rows must be True, False or None"):
            ByteLM(lm, device_rows="no")  # truthy: it asked for torch rows
        # The mass cache's budget is named as the caller passed it; a whole float is taken.
        for bad, error in ((2.5, TypeError), ("100", TypeError), (-1, ValueError)):
            with pytest.raises(error, match="cache_bytes must be"):
                ByteLM(lm, cache_bytes=bad)
        assert ByteLM(lm, cache_bytes=1e6).cache.max_bytes == 10**6
        with pytest.raises(TypeError, match="byte strings.*got 'a'"):
            ByteLM(lm, eos=["a"])
        state = await ByteLM(lm).initial((0,))
        with pytest.raises(ValueError, match="0..255"):
            await state.advance(256)
        with pytest.raises(ValueError, match="empty token context"):
            await ByteLM(lm).initial([])

    run(scenario())


@pytest.mark.parametrize("data", [3, np.int64(2), True, "ab", None, 2.5, [97, 2.5]], ids=repr)
def test_prefill_refuses_what_is_not_bytes(data):
    """prefill() raises a TypeError naming its argument for anything but bytes: an int
    prefilled that many NUL bytes (bytes(3)), text and None said only what bytes() said."""

    async def scenario():
        lm = FixedLM(VOCAB, np.ones(len(TOKENS)))
        states = [
            await ByteLM(lm, K=4).initial((0,)),
            await ByteBeamState.initial(lm, BeamParams(K=4)),
        ]
        # Bytes in any form: the brute-force probability of b"ab" (uniform rows).
        uniform = np.full(len(TOKENS), -np.log(len(TOKENS)))
        expected = brute_force_prefix_logprob(lambda ctx: uniform, VOCAB, (0,), b"ab", TEXT)
        for state in states:
            with pytest.raises(TypeError, match="prefill's data must be bytes"):
                await state.prefill(data)
            with pytest.raises(ValueError, match="prefill's data must be bytes"):
                await state.prefill([97, 300])
            for ok in (b"ab", bytearray(b"ab"), memoryview(b"ab"), [97, 98]):
                assert (await state.prefill(ok)).logZ == pytest.approx(expected, abs=1e-12)

    run(scenario())


def test_prefill_reads_byte_value_arrays_by_value():
    """A numpy array or a memoryview of byte values is prefilled as those values, and a
    value that is no byte is refused naming it: bytes() copied their memory, so
    np.array([97, 98]) (int64) prefilled b"a" and seven NUL bytes and so on, 353 passed as
    b"a\\x01..." and a float as its eight raw bytes."""

    async def scenario():
        state = await ByteLM(FixedLM(VOCAB, np.ones(len(TOKENS))), K=4).initial((0,))
        by_list = await state.prefill([97, 98])
        assert by_list.data == b"ab"
        values = np.array([97, 98])
        for data in (values, values.astype(np.uint16), memoryview(values)):
            after = await state.prefill(data)
            assert (after.data, after.logZ) == (b"ab", by_list.logZ)
        for data, error, value in (
            (np.array([97, 353]), ValueError, "353 at position 1"),
            (np.array([97.5]), TypeError, "97.5 at position 0"),
            (np.array([[97, 98]]), TypeError, r"\[97, 98\] at position 0"),
            ([97, True], TypeError, "True at position 1"),
            (np.array(97), TypeError, "ndarray"),
        ):
            with pytest.raises(error, match=f"prefill's data must be bytes.*{value}"):
                await state.prefill(data)

    run(scenario())


@pytest.mark.parametrize(
    ("prompt", "says"),
    [([0, 2.5], "float"), ([0, True], "bool"), ({0, 2}, "set"), ({0: 2}, "dict")],
)
def test_token_id_prompts_are_checked_like_core_contexts(prompt, says):
    """initial() checks token ids as core does: [0, 2.5] used to start from (0, 2), a set
    or dict from its iteration order, True from token 1."""

    async def scenario():
        with pytest.raises(InvalidContextError, match=says):
            await ByteLM(FixedLM(VOCAB, np.ones(len(TOKENS)))).initial(prompt)

    run(scenario())


def test_a_memoryview_prompt_is_bytes():
    """A memoryview is raw bytes like bytes and bytearray (it was read as token ids)."""

    async def scenario():
        byte_lm = ByteLM(FixedLM(VOCAB, np.ones(len(TOKENS))))
        viewed = await (await byte_lm.initial(memoryview(b"ab."))).logp_next()
        given = await (await byte_lm.initial(b"ab.")).logp_next()
        np.testing.assert_array_equal(viewed.logprobs, given.logprobs)

    run(scenario())


def test_bytes_prompt_without_bos_uses_the_first_token():
    """Without BOS, a bytes prompt starts from its longest first token and prefills the rest."""

    async def scenario():
        vocab = Vocabulary(TOKENS[2:])
        lm = FixedLM(vocab, np.ones(len(vocab)))
        state = await ByteLM.from_prompt(lm, b"abcb", K=None)
        assert state.candidates[0].context[0] == vocab.tokens.index(b"abc")
        assert state.data == b"b"

    run(scenario())


def test_a_context_past_the_models_limit_raises_invalid_context_error():
    """Advancing past the model's max_context_length raises core's InvalidContextError
    itself, which callers (and the CLI) can catch and report; it used to arrive wrapped in
    an ExceptionGroup ('unhandled errors in a TaskGroup (2 sub-exceptions)' from
    `genlm bytes --sample 2500`), which `except InvalidContextError` does not catch."""

    async def scenario():
        async with MockLM(VOCAB, max_context_length=3) as lm:
            byte_lm = ByteLM(lm, K=None)
            state = await byte_lm.initial()
            with pytest.raises(InvalidContextError, match="maximum of 3") as info:
                for byte in b"a.b.c.a.b.c.":
                    await state.logp_next()
                    state = await state.advance(byte)
            assert isinstance(info.value.__context__, ExceptionGroup)

    run(scenario())


@pytest.mark.parametrize(
    ("temperature", "error"),
    [(float("nan"), ValueError), (float("inf"), ValueError), (-1.0, ValueError), (True, TypeError)],
)
def test_byte_sampling_checks_the_temperature_like_core(temperature, error):
    """sample() refuses what core's sample refuses: NaN used to fail as 'no byte and no EOS
    has positive probability here', inf as numpy's 'Probabilities contain NaN', and True
    sampled at temperature 1."""

    async def scenario():
        state = await ByteLM(FixedLM(VOCAB, np.ones(len(TOKENS)))).initial(b"a")
        with pytest.raises(error, match="temperature must be"):
            await state.sample(3, seed=0, temperature=temperature)

    run(scenario())


@pytest.mark.parametrize(
    ("max_bytes", "error"),
    [(True, TypeError), (2.5, TypeError), (None, TypeError), ("3", TypeError), (-1, ValueError)],
    ids=repr,
)
def test_byte_sampling_checks_max_bytes_like_core_checks_max_tokens(max_bytes, error):
    """sample() refuses a max_bytes that is no integer >= 0 by name, as core refuses such a
    max_tokens (True drew one byte; 2.5, None and "3" failed with range()'s or a
    comparison's message); a bad temperature is refused even when nothing is drawn."""

    async def scenario():
        state = await ByteLM(FixedLM(VOCAB, np.ones(len(TOKENS)))).initial(b"a")
        with pytest.raises(error, match="max_bytes must be"):
            await state.sample(max_bytes, seed=0)
        with pytest.raises(error, match="max_bytes must be"):
            await state.greedy(max_bytes)
        with pytest.raises(ValueError, match="temperature must be"):
            await state.sample(0, temperature=float("nan"))
        # numpy integers are integers: the same draws as the int.
        drawn = await state.sample(np.int64(3), seed=0)
        assert drawn.data == (await state.sample(3, seed=0)).data and len(drawn.data) <= 3

    run(scenario())


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"seed": -1}, ValueError, "seed must be None or a non-negative integer, got -1"),
        ({"seed": "x"}, TypeError, "seed must be None or a non-negative integer, got 'x'"),
        ({"seed": 1.5}, TypeError, "seed must be None or a non-negative integer, got 1.5"),
        ({"rng": 5}, TypeError, "rng must be a numpy.random.Generator.*got 5"),
        ({"rng": "x"}, TypeError, "rng must be a numpy.random.Generator.*got 'x'"),
    ],
    ids=["seed=-1", "seed='x'", "seed=1.5", "rng=5", "rng='x'"],
)
def test_byte_sampling_names_a_bad_seed_or_rng(options, error, says):
    """sample() refuses a bad seed as core's sample does (genlm.core.backend.seeded_rng),
    naming it: numpy said "expected non-negative integer" or "SeedSequence expects int";
    an rng that is no Generator failed as "'int' object has no attribute 'choice'"."""

    async def scenario():
        state = await ByteLM(FixedLM(VOCAB, np.ones(len(TOKENS)))).initial(b"a")
        with pytest.raises(error, match=says):
            await state.sample(3, **options)
        rng = np.random.default_rng(0)
        drawn = await state.sample(3, rng=rng)  # a Generator draws, as the seed's would
        assert drawn.data == (await state.sample(3, seed=0)).data
        legacy = await state.sample(3, rng=np.random.RandomState(0))  # it has choice too
        again = await state.sample(3, rng=np.random.RandomState(0))
        assert legacy.data == again.data and len(legacy.data) == 3

    run(scenario())


def test_next_byte_logprobs_name_a_bad_key_k_or_rng():
    """dist[key] takes a byte, EOS or EOT as an integer and raises KeyError naming any
    other key (97.0 failed in numpy's words, "a" and None in a comparison's); top(k) refuses
    a k that is no count (top(-1) returned all but the last symbol); sample() refuses an
    rng that is no Generator by name."""
    logprobs = np.log(np.full(EOS + 1, 1 / (EOS + 1)))
    dist = NextByteLogprobs(logprobs, log_eot=-0.5)
    assert dist[97] == dist[np.int64(97)] == logprobs[97] and dist[EOT] == -0.5
    for key in (97.0, "a", None, True, -1, EOT + 1, b"a"):
        with pytest.raises(KeyError, match=f"expected a byte 0..255.*got {re.escape(repr(key))}"):
            dist[key]
    assert len(dist.top(EOS + 1)) == EOS + 1 and dist.top(0) == []
    with pytest.raises(ValueError, match="k must be >= 0, got -1"):
        dist.top(-1)
    with pytest.raises(TypeError, match="k must be an integer, got 2.5"):
        dist.top(2.5)
    for rng in (None, 5):
        with pytest.raises(TypeError, match=f"rng must be a numpy.random.Generator.*got {rng}"):
            dist.sample(rng)


@pytest.mark.parametrize("threshold", ["0.1", None, True], ids=repr)
def test_a_prune_threshold_that_is_no_number_is_named(threshold):
    """ByteLM and BeamParams refuse a prune_threshold that is no real number with a
    TypeError naming it; "0.1" and None failed in a comparison's words, True as out of range."""
    lm = FixedLM(VOCAB, np.ones(len(TOKENS)))
    says = f"prune_threshold must be a number in \\[0, 1\\), got {re.escape(repr(threshold))}"
    with pytest.raises(TypeError, match=says):
        ByteLM(lm, prune_threshold=threshold)
    with pytest.raises(TypeError, match=says):
        BeamParams(K=4, prune_threshold=threshold)
    assert ByteLM(lm, prune_threshold=np.float32(0.5)).prune_threshold == 0.5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampling_stops_at_the_context_limit_keeping_its_bytes(seed):
    """``sample`` stops where the next distribution would need a context over the model's
    ``max_context_length`` (``logp_next`` would raise there), returning the bytes drawn:
    the same ones an unlimited model draws first with the same seed."""

    async def scenario():
        async with MockLM(VOCAB, max_context_length=4) as short, MockLM(VOCAB) as free:
            out = await (await ByteLM(short, K=None).initial()).sample(200, seed=seed)
            assert out.at_limit and not out.eos and out.data
            with pytest.raises(InvalidContextError, match="maximum of 4"):
                await out.state.logp_next()
            unlimited = await (await ByteLM(free, K=None).initial()).sample(200, seed=seed)
            assert not unlimited.at_limit
            assert unlimited.data.startswith(out.data)
            short_again = await (await ByteLM(short, K=None).initial()).sample(1, seed=seed)
            assert not short_again.at_limit  # one byte fits

    run(scenario())
