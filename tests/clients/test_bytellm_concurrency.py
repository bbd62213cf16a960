"""genlm-control's ``ByteLLM`` on GenLM, called as an SMC step calls it: concurrently.

Its first calls store the beam ``ByteBeamState.initial`` returns, then prefill the prompt
into it; concurrent callers must all get the prompted row, as one caller alone does (on
genlm-bytes 0.2.0, whose ``initial`` awaits the LM, they do). Runs in ``nox -s clients``.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("genlm.control")


def test_concurrent_first_calls_all_see_the_prompt():
    from genlm.backend import load_model_by_name
    from genlm.bytes import BeamParams
    from genlm.control import ByteLLM

    llm = load_model_by_name("stories260K", backend="hf")
    params = BeamParams(K=5, prune_threshold=0.0)

    async def rows(callers: int) -> list[np.ndarray]:
        byte_llm = ByteLLM(llm, params)
        byte_llm.set_prompt_from_str("Once upon a time")
        out = await asyncio.gather(*(byte_llm.logw_next([]) for _ in range(callers)))
        await byte_llm.cleanup()
        return [np.asarray(row.weights) for row in out]

    [alone] = asyncio.run(rows(1))
    for row in asyncio.run(rows(4)):
        np.testing.assert_array_equal(row, alone)
    llm.close()
