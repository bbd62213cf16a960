"""genlm-bytes' wheel: next-byte conditionals chain to the prefix probability."""

from __future__ import annotations

import asyncio

import numpy as np
from _smoke import assert_installed, start


async def check() -> None:
    import genlm.bytes
    from genlm.bytes import ByteLM
    from genlm.core import load_model_by_name

    assert_installed(genlm.bytes)
    lm = load_model_by_name("stories260K", backend="hf")
    async with ByteLM(lm, K=8, close_lm=True) as byte_lm:
        state = await byte_lm.initial([lm.vocab.bos_token_id])
        state = await state.prefill(b" Once upon a")
        dist = await state.logp_next()
        # Bytes and EOS carry at most all the mass (float32 rows: up to a rounding error).
        assert dist.log_total <= 1e-6 and np.isfinite(dist[ord(" ")])
        after = await (state << ord(" "))
        np.testing.assert_allclose(after.logZ, state.logZ + dist[ord(" ")], atol=1e-6)


def main() -> None:
    start("genlm-bytes")
    asyncio.run(check())


if __name__ == "__main__":
    main()
