"""The portable row route (vLLM's own full-vocab logprobs output), with the engine core in a
child process as in multi-GPU and Ray deployments, and a clean shutdown."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from genlm.core import ModelClosedError


@pytest.fixture(scope="module")
def portable_lm(tiny_path):
    """A second engine, multiprocess (VLLM_ENABLE_V1_MULTIPROCESSING=1), logprobs route."""
    from genlm.backends.vllm import VLLMLM

    from .conftest import ENGINE_OPTS

    opts = {k: v for k, v in ENGINE_OPTS.items() if k not in ("enable_lora", "max_lora_rank")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        lm = VLLMLM.from_name(str(tiny_path), engine_opts=opts, cache_bytes=0)
    yield lm
    lm.close()


def test_portable_route_rows_match_transformers_then_aclose(portable_lm, expected):
    """Rows from the logprobs route equal transformers'; aclose then shuts the engine down."""
    assert portable_lm.row_source == "logprobs"
    rng = np.random.default_rng(7)
    contexts = [[int(t) for t in rng.integers(0, 50257, size=n)] for n in (1, 17, 40, 75)]

    async def run():
        rows = await asyncio.gather(*(portable_lm.next_token_logprobs(c) for c in contexts))
        await portable_lm.aclose()
        return rows

    rows = asyncio.run(run())
    for context, row in zip(contexts, rows):
        np.testing.assert_allclose(row, expected(context), atol=1e-3)
    assert portable_lm.llm is None
    with pytest.raises(ModelClosedError):
        portable_lm.next_token_logprobs_sync(contexts[0])
