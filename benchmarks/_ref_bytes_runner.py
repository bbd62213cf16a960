"""Reference side of bytes_bench.py: genlm-bytes 0.2.0 over genlm-backend 0.3.1.

Runs in its own venv (a subprocess of bytes_bench.py); prints one JSON line per run.
"""

import asyncio
import json
import os
import sys
import time

from _common import require_reference

os.environ.setdefault("HF_HUB_OFFLINE", "1")


async def main(
    model_dir: str, text: bytes, Ks: list[int], threads: int, repeats: int, dtype: str
) -> None:
    import torch

    torch.set_num_threads(threads)
    require_reference()
    from genlm.backend.llm import AsyncTransformer
    from genlm.bytes import BeamParams, ByteBeamState

    llm = AsyncTransformer.from_name(model_dir, hf_opts={"torch_dtype": dtype})
    for K in Ks:
        times = []
        for _ in range(repeats):  # each run cold, as on our side
            llm.clear_cache()
            state = await ByteBeamState.initial(llm, BeamParams(K=K))
            start = time.perf_counter()
            state = await state.prefill(text)
            times.append(time.perf_counter() - start)
            await state.cleanup()
        result = {"K": K, "neg_logp": -float(state.logZ), "seconds": min(times)}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    model_dir, text_hex, ks, threads, repeats, dtype = sys.argv[1:7]
    Ks = [int(k) for k in ks.split(",")]
    asyncio.run(main(model_dir, bytes.fromhex(text_hex), Ks, int(threads), int(repeats), dtype))
