"""genlm-backend-mlx's wheel: its row equals the hf backend's on the embedded model."""

from __future__ import annotations

import asyncio

import numpy as np
from _smoke import assert_installed, start


def main() -> None:
    start("genlm-backend-mlx")
    import genlm.backends.mlx
    from genlm.core import load_model_by_name

    assert_installed(genlm.backends.mlx)
    context = [1, 403, 407, 261]
    rows = []
    for backend in ("mlx", "hf"):
        lm = load_model_by_name("stories260K", backend=backend)
        rows.append(asyncio.run(lm.next_token_logprobs(context)))
        lm.close()
    np.testing.assert_allclose(rows[0], rows[1], atol=1e-4)


if __name__ == "__main__":
    main()
