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
