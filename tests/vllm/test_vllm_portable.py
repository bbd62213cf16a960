"""The portable row route (vLLM's full-vocab logprobs output) with the engine core in a
child process, as with tensor/pipeline parallelism and Ray, and a clean shutdown."""

from __future__ import annotations

import json
import textwrap

import numpy as np

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    import numpy as np
    from genlm.backends.vllm import VLLMLM
    from genlm.core import ModelClosedError

    path, out = sys.argv[1], sys.argv[4]
    opts, contexts = json.loads(sys.argv[2]), json.loads(sys.argv[3])
    lm = VLLMLM.from_name(path, engine_opts=opts, cache_bytes=0)
    client = type(lm.llm.llm_engine.engine_core).__name__

    async def run():
        rows = await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))
        await lm.aclose()
        return rows

    rows = asyncio.run(run())
    try:
        lm.next_token_logprobs_sync(contexts[0])
        closed = False
    except ModelClosedError:
        closed = True
    np.savez(out, rows=np.stack(rows))
    print(json.dumps({"route": lm.row_source, "client": client, "closed": closed,
                      "engine_released": lm.llm is None}))
    """
)


def test_portable_route_in_a_multiprocess_engine(tiny_path, expected, tmp_path):
    """With VLLM_ENABLE_V1_MULTIPROCESSING=1, rows come by the logprobs route, equal
    transformers', and aclose shuts the engine and its child process down."""
    from .conftest import ENGINE_OPTS_NO_LORA, run_in_process

    rng = np.random.default_rng(7)
    contexts = [[int(t) for t in rng.integers(0, 50257, size=n)] for n in (1, 17, 40, 75)]
    out = tmp_path / "rows.npz"
    args = [str(tiny_path), json.dumps(ENGINE_OPTS_NO_LORA), json.dumps(contexts), str(out)]
    report = run_in_process(SCRIPT, args, multiprocessing=True)
    assert report == {
        "route": "logprobs",
        "client": "SyncMPClient",
        "closed": True,
        "engine_released": True,
    }
    rows = np.load(out)["rows"]
    for context, row in zip(contexts, rows):
        np.testing.assert_allclose(row, expected(context), atol=1e-4)
