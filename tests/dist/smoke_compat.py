"""genlm-backend-compat's wheel: the 0.3 API's rows equal the hf backend's."""

from __future__ import annotations

import asyncio

import numpy as np
from _smoke import assert_installed, start


async def check() -> None:
    import importlib.metadata

    import genlm.backend

    # 0.3's documented extras, `[mlx]` and `[lora]`, bring the GenLM distributions for them.
    meta = importlib.metadata.metadata("genlm-backend-compat")
    assert {"mlx", "lora"} <= set(meta.get_all("Provides-Extra")), meta.get_all("Provides-Extra")
    requires = meta.get_all("Requires-Dist")
    assert any(r.startswith("genlm-backend-mlx") and 'extra == "mlx"' in r for r in requires)
    assert any(r.startswith("genlm-backend-hf[lora]") and 'extra == "lora"' in r for r in requires)
    from genlm.backend import load_model_by_name as load_03
    from genlm.core import load_model_by_name

    assert_installed(genlm.backend)
    context = [1, 403, 407]
    llm = load_03("stories260K", backend="hf")
    old = (await llm.next_token_logprobs(context)).cpu().numpy()
    lm = load_model_by_name("stories260K", backend="hf")
    np.testing.assert_allclose(old, await lm.next_token_logprobs(context), atol=1e-5)
    lm.close()


def main() -> None:
    start("genlm-backend-compat")
    asyncio.run(check())


if __name__ == "__main__":
    main()
