"""Exactness of the byte-level LM against brute-force enumeration of tokenizations."""

from __future__ import annotations

import numpy as np
import pytest
from support.bytes_lms import brute_force_prefix_logprob, run

from genlm.bytes import EOS, ByteLM
from genlm.core.backend import resolve_model_path

STRINGS = [
    b" Once",
    b" caf\xc3\xa9",  # " café": byte-fallback tokens after a word piece
    "é".encode(),
    "🙂".encode(),
    "東京".encode(),
    b"a\n",
]


def _text_ids(vocab) -> set[int]:
    return {i for i in vocab.text_ids.tolist() if vocab.tokens[i]}


def _exact(lm, data: bytes) -> float:
    """log P(data | BOS) by brute-force enumeration of the tokenizations."""
    return brute_force_prefix_logprob(lm.row, lm.vocab, (1,), data, _text_ids(lm.vocab))


async def _chain(state, data: bytes) -> tuple[float, object]:
    total = 0.0
    for b in data:
        total += (await state.logp_next())[b]
        state = await state.advance(b)
    return total, state


@pytest.mark.parametrize("data", STRINGS, ids=repr)
def test_chain_rule_matches_brute_force_on_stories260k(stories64, data):
    """Unpruned, the product of next-byte conditionals is the exact prefix probability (1e-9)."""

    async def scenario():
        expected = _exact(stories64, data)
        state = await ByteLM(stories64, K=None).initial((1,))
        chained, final = await _chain(state, data)
        assert chained == pytest.approx(expected, abs=1e-9)
        assert final.logZ == pytest.approx(expected, abs=1e-9)

    run(scenario())


def test_first_byte_distribution_is_the_token_mass_by_first_byte(stories64):
    """At a boundary, P(byte b) is the mass of tokens starting with b; P(EOS) is p(</s>)."""

    async def scenario():
        row = stories64.row((1,))
        vocab = stories64.vocab
        dist = await (await ByteLM(stories64, K=None).initial((1,))).logp_next()
        expected = np.zeros(257)
        for t in _text_ids(vocab):
            expected[vocab.tokens[t][0]] += np.exp(row[t])
        expected[EOS] = np.exp(row[2])
        with np.errstate(divide="ignore"):
            np.testing.assert_allclose(dist.logprobs, np.log(expected), rtol=0, atol=1e-12)
        # The rest is the mass of <unk> and <s>, which spell no bytes.
        assert np.exp(dist.log_total) == pytest.approx(
            1 - np.exp(row[0]) - np.exp(row[1]), abs=1e-12
        )

    run(scenario())


def test_an_hf_model_padded_beyond_its_tokenizer_spells_only_its_text_tokens():
    """hf rows of a model padded to 600 logits for its 512 tokens: the padding ids are unused
    and spell no bytes, so the chain rule equals brute force over the text tokens of the
    full-width rows, and the first byte's total leaves out the padding's mass as it leaves
    out <unk>'s and <s>'s."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    HFLM = pytest.importorskip("genlm.backends.hf").HFLM
    path = resolve_model_path("stories260K")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    model.resize_token_embeddings(600)
    with torch.no_grad():
        model.get_output_embeddings().weight[512:] = 0.5
    lm = HFLM(model, transformers.AutoTokenizer.from_pretrained(path), cache_bytes=0)
    context = (1, 403, 407)

    def row(context):
        return lm.next_token_logprobs_sync(context).astype(np.float64)

    async def scenario():
        padding = np.exp(row(context)[512:]).sum()  # about 2% there
        assert padding > 0.01 and lm.vocab.unused_ids >= set(range(512, 600))
        first = await (await ByteLM(lm, K=None).initial(context)).logp_next()
        unspelled = np.exp(row(context)[[0, 1]]).sum() + padding
        assert np.exp(first.log_total) == pytest.approx(1 - unspelled, abs=1e-6)
        for data in (b" Once", b" caf\xc3\xa9"):
            state = await ByteLM(lm, K=None).initial(context)
            chained, _ = await _chain(state, data)
            text_ids = _text_ids(lm.vocab)
            expected = brute_force_prefix_logprob(row, lm.vocab, context, data, text_ids)
            assert chained == pytest.approx(expected, abs=1e-9)

    try:
        run(scenario())
    finally:
        lm.close()


@pytest.mark.parametrize("data", STRINGS, ids=repr)
def test_pruned_estimate_is_a_lower_bound_exact_once_k_holds_the_beam(stories64, data):
    """With pruning, logZ never exceeds the exact value (brute force) for any K, and equals
    it once K is at least every unpruned beam's size. It need not rise with K: a wider beam
    can keep other candidates and lose the path a narrower one kept (the docs said it rose,
    and this test asserted it on one string)."""

    async def scenario():
        exact = _exact(stories64, data)
        state, widest = await ByteLM(stories64, K=None).initial((1,)), 1
        for b in data:
            widest = max(widest, len(state))
            state = await state.advance(b)
        for K in (1, 2, 3, 4, 16):
            pruned = await (await ByteLM(stories64, K=K).initial((1,))).prefill(data)
            assert pruned.logZ <= exact + 1e-12
            if K >= widest:
                assert pruned.logZ == pytest.approx(exact, abs=1e-9)
        holding = await (await ByteLM(stories64, K=widest).initial((1,))).prefill(data)
        assert holding.logZ == pytest.approx(exact, abs=1e-9)

    run(scenario())


def test_k_1_prunes_on_the_lower_bound_strings(stories64):
    """The lower-bound test above is not vacuous: with K=1, " café" loses mass."""

    async def scenario():
        data = b" caf\xc3\xa9"
        state = await (await ByteLM(stories64, K=1).initial((1,))).prefill(data)
        assert state.logZ < _exact(stories64, data) - 1e-9

    run(scenario())


def test_prompt_bytes_marginalize_over_tokenizations(stories64):
    """A bytes prompt starts at BOS and prefills: logZ is its exact prefix probability."""

    async def scenario():
        data = b" caf\xc3\xa9"
        expected = _exact(stories64, data)
        state = await ByteLM.from_prompt(stories64, data, K=None)
        assert state.data == data
        assert state.logZ == pytest.approx(expected, abs=1e-9)

    run(scenario())


@pytest.mark.parametrize(("K", "lookahead"), [(1, 1), (4, 0), (4, 1), (4, 3)])
def test_prefill_shortcuts_keep_the_plain_beam(stories64, K, lookahead):
    """Prefill (skipped doomed boundaries, prefetched rows) ends in the same beam as advancing."""

    async def scenario():
        data = b" Once upon a time, Lily saw a caf\xc3\xa9."
        plain = await ByteLM(stories64, K=K).initial((1,))
        for b in data:
            plain = await plain.advance(b)
        fast_lm = ByteLM(stories64, K=K, lookahead=lookahead)
        fast = await (await fast_lm.initial((1,))).prefill(data)
        assert fast.logZ == pytest.approx(plain.logZ, abs=1e-12)
        assert [(c.context, c.node) for c in fast.candidates] == [
            (c.context, c.node) for c in plain.candidates
        ]

    run(scenario())


class _RefusingLM:
    """An LM that refuses contexts past 8 tokens without declaring a limit (a backend's own
    failure), so only the refusal itself can keep a guess out."""

    def __init__(self, lm):
        self.lm, self.vocab = lm, lm.vocab

    async def next_token_logprobs(self, token_ids):
        if len(token_ids) > 8:
            raise RuntimeError(f"refused a {len(token_ids)}-token context")
        return await self.lm.next_token_logprobs(token_ids)


@pytest.mark.parametrize("lookahead", [1, 2, 3])
@pytest.mark.parametrize("limit", ["declared", "refused"])
def test_prefetched_guesses_past_the_context_limit_change_nothing(lookahead, limit):
    """A prefill whose guessed boundaries pass the LM's context limit (declared as
    ``max_context_length``, or only refused) ends as the same prefill without lookahead: a
    guess the LM would refuse is left out, it does not fail the step (it raised)."""
    from genlm.core.mock import MockLM

    async def scenario():
        data = b" Once upon a time, the"
        async with MockLM.from_name("stories260K", max_context_length=8) as mock:
            lm = mock if limit == "declared" else _RefusingLM(mock)
            plain = await (await ByteLM(lm, K=4, lookahead=0).initial((1,))).prefill(data)
            mock.clear_cache()
            fast = await (await ByteLM(lm, K=4, lookahead=lookahead).initial((1,))).prefill(data)
            assert max(len(c.context) for c in plain.candidates) == 8  # at the limit
            assert fast.logZ == pytest.approx(plain.logZ, abs=1e-12)
            assert (await fast.logp_next()).logprobs == pytest.approx(
                (await plain.logp_next()).logprobs, abs=1e-12
            )

    run(scenario())
