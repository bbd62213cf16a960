"""A facade model is a genlm-core ``AsyncLM`` (issue 24 item 2): genlm-bytes takes it as it is.

genlm-control 0.4.1 hands a facade model to ``ByteBeamState.initial``; genlm-bytes no longer
unwraps ``core_lm``, so the facade must answer as core's protocol says (``output=`` and
``variant=`` keywords) while its own API keeps returning torch rows.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from support.rolled import RolledLM

from genlm.backend.llm import MockAsyncLM
from genlm.bytes import BeamParams, ByteBeamState
from genlm.core import AsyncLM

CONTEXT = [1, 403, 407]


def test_a_facade_model_is_a_core_async_lm(hf_llm):
    """The protocol's members and keywords: numpy rows on request, torch rows by default."""
    assert isinstance(hf_llm, AsyncLM)
    core = hf_llm.core_lm.next_token_logprobs_sync(CONTEXT)
    np.testing.assert_array_equal(hf_llm.next_token_logprobs_sync(CONTEXT, output="numpy"), core)
    assert isinstance(hf_llm.next_token_logprobs_sync(CONTEXT), torch.Tensor)
    rows = asyncio.run(hf_llm.batch_next_token_logprobs([CONTEXT, CONTEXT], output="numpy"))
    np.testing.assert_array_equal(rows, np.stack([core, core]))
    assert hf_llm.device_rows == hf_llm.core_lm.device_rows


def test_variant_is_lora_name():
    """``variant=`` is core's name of ``lora_name``; both, differing, are refused."""
    mock = MockAsyncLM.from_name("stories260K")
    with pytest.raises(ValueError, match="no variants"):
        mock.next_token_logprobs_sync(CONTEXT, variant="a")
    with pytest.raises(ValueError, match="lora_name='a' and variant='b'"):
        mock.next_token_logprobs_sync(CONTEXT, lora_name="a", variant="b")
    mock.close()


def test_the_published_byte_api_takes_the_facade_as_it_is(hf_llm):
    """genlm-control's calls on the facade model give the numbers they give on its core
    model (the same float32 rows, handed as tensors)."""
    params = BeamParams(K=3, eos_tokens=[b"."])

    async def walk(llm):
        beam = await ByteBeamState.initial(llm, params)
        beam = await beam.prefill(b" Once upon a")
        out = []
        for b in b" time, there":
            beam = await (beam.prune() << b)
            out.append((beam.logZ, (await beam.logp_next()).ps))
        await beam.cleanup()
        return out

    via_facade, via_core = asyncio.run(walk(hf_llm)), asyncio.run(walk(hf_llm.core_lm))
    for (z1, ps1), (z2, ps2) in zip(via_facade, via_core, strict=True):
        assert z1 == z2 and np.isfinite(z1)
        np.testing.assert_array_equal(ps1, ps2)


def test_genlm_bytes_takes_a_subclass_of_the_documented_base_class(hf_llm):
    """A model written against 0.3.1's ``AsyncLM`` base class (``super().__init__(tokenizer)``
    and the two row methods, torch rows) runs under genlm-bytes as 0.2.0 ran it: the same
    numbers as the core model it forwards to."""
    from genlm.backend.llm import AsyncLM as BaseLM

    class Forwarding(BaseLM):
        def __init__(self, core_lm):
            super().__init__(core_lm.tokenizer)
            self.core_lm = core_lm

        async def next_token_logprobs(self, token_ids):
            return await self.core_lm.next_token_logprobs(token_ids, output="torch")

        def next_token_logprobs_sync(self, token_ids):
            return self.core_lm.next_token_logprobs_sync(token_ids, output="torch")

    user = Forwarding(hf_llm.core_lm)
    assert user.vocab.tokens == hf_llm.core_lm.vocab.tokens
    assert user.vocab.eos_token_ids == hf_llm.core_lm.vocab.eos_token_ids

    async def walk(llm):
        beam = await ByteBeamState.initial(llm, BeamParams(K=3))
        beam = await beam.prefill(b" Once upon")
        out = [(beam.logZ, (await beam.logp_next()).ps)]
        await beam.cleanup()
        return out

    for (z1, ps1), (z2, ps2) in zip(asyncio.run(walk(user)), asyncio.run(walk(hf_llm.core_lm))):
        assert z1 == z2 and np.isfinite(z1)
        np.testing.assert_array_equal(ps1, ps2)


def test_a_single_state_starts_from_a_facade_model_and_its_trie(hf_llm):
    """``LazyTrieState.initial(llm, AsyncTokenByteTrie.from_vocab(llm.byte_vocab, ...))``,
    as 0.2 programs write it, takes the facade model and its token list. Walking a text
    (a token ends where the next byte cannot continue it), each whole partial token
    ``extend``s to the weight its ids have in the facade's own rows."""
    from genlm.bytes import AsyncTokenByteTrie, LazyTrieState

    eos = hf_llm.byte_vocab[hf_llm.tokenizer.eos_token_id].byte_string
    trie = AsyncTokenByteTrie.from_vocab(hf_llm.byte_vocab, eos_tokens=[eos])
    specials = set(hf_llm.vocab.special_ids)

    def logp(context):
        """log P(context[1:] | BOS) from the facade's rows."""
        rows = [hf_llm.next_token_logprobs_sync(list(context[:i])) for i in range(1, len(context))]
        return sum(float(r[t]) for r, t in zip(rows, context[1:]))

    async def walk():
        state = await LazyTrieState.initial(hf_llm, trie).materialize()
        ended = []
        for b in b" Once upon a time":
            if state << b is None:
                extended = state.extend()
                ids = [
                    t.token_id
                    for t in hf_llm.byte_vocab
                    if t.byte_string == state.partial and t.token_id not in specials
                ]
                assert ids == [state.get_EOT()]
                ended.append(ids[0])
                expected = logp(extended.candidate.context)
                assert extended.weight == pytest.approx(expected, abs=1e-9)
                state = await extended.materialize()
            state = state << b
        assert len(ended) > 2
        await state.cleanup()

    asyncio.run(walk())


def test_a_byte_lm_over_a_facade_model_follows_its_adapter():
    """The facade tells its core model's adapter (``current_variant``): a ByteLM made before
    ``set_lora`` or ``clear_lora`` gives what a fresh one gives under the same adapter (it
    kept the masses of the adapter active when they were computed)."""
    from genlm.bytes import ByteLM

    async def distribution(byte_lm):
        state = await byte_lm.initial([0])
        return (await state.logp_next()).logprobs

    async def scenario():
        llm = MockAsyncLM._wrap(RolledLM([bytes([b]) for b in range(97, 112)]))
        llm.core_lm.add_lora(5, "rolled")
        reused = ByteLM(llm, K=None)
        base = await distribution(reused)
        llm.set_lora(lora_name="rolled")
        assert llm.current_variant == "rolled"
        rolled = await distribution(reused)
        np.testing.assert_allclose(rolled, await distribution(ByteLM(llm, K=None)), atol=1e-9)
        assert not np.allclose(rolled, base)
        llm.clear_lora()
        np.testing.assert_allclose(await distribution(reused), base, atol=1e-9)
        await llm.aclose()

    asyncio.run(scenario())
