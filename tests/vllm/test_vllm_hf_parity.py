"""vLLM's rows against the hf backend's rows for the same weights, under a scheduler that
must split every batch (``max_num_seqs=2``); on CUDA when there is one, else on CPU."""

from __future__ import annotations

import asyncio

import numpy as np

from .test_vllm_logprobs import ATOL, RTOL, distinct_contexts


def test_split_batches_give_the_hf_backends_rows(vllm_lm, tiny_path):
    """24 concurrent contexts through a 2-sequence scheduler equal HFLM's rows (fp32 both)."""
    from genlm.backends.hf import HFLM

    scheduler = vllm_lm.llm.llm_engine.vllm_config.scheduler_config
    assert scheduler.max_num_seqs == 2  # 24 requests cannot run in one engine step
    contexts = distinct_contexts(24, seed=11)
    vllm_lm.clear_cache()
    hf = HFLM.from_name(str(tiny_path), cache_bytes=0)
    try:
        assert hf.model.dtype.is_floating_point and hf.model.dtype.itemsize == 4

        async def both():
            ours = asyncio.gather(*(vllm_lm.next_token_logprobs(c) for c in contexts))
            theirs = asyncio.gather(*(hf.next_token_logprobs(c) for c in contexts))
            return await asyncio.gather(ours, theirs)

        rows, hf_rows = asyncio.run(both())
    finally:
        hf.close()
    for i, (row, hf_row) in enumerate(zip(rows, hf_rows)):
        np.testing.assert_allclose(row, hf_row, atol=ATOL, rtol=RTOL, err_msg=f"context {i}")
        # each row is its own context's, not a neighbour's from the same split batch
        distances = [np.abs(row - other).max() for other in hf_rows]
        assert int(np.argmin(distances)) == i
