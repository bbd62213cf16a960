"""genlm-backend-hf's wheel: a row equals transformers' own, and `genlm smc` runs."""

from __future__ import annotations

import asyncio

import numpy as np
from _smoke import assert_installed, run_genlm, start


def main() -> None:
    start("genlm-backend-hf")
    import torch
    from transformers import AutoModelForCausalLM

    import genlm.backends.hf
    from genlm.core import load_model_by_name
    from genlm.core.backend import resolve_model_path

    assert_installed(genlm.backends.hf)
    context = [1, 403, 407, 261]
    lm = load_model_by_name("stories260K")  # auto-selection picks hf on a CPU
    assert type(lm).__module__.startswith("genlm.backends.hf"), type(lm)
    row = asyncio.run(lm.next_token_logprobs(context))
    lm.close()
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("stories260K"))
    with torch.no_grad():
        logits = model(torch.tensor([context])).logits[0, -1].double()
    np.testing.assert_allclose(row, torch.log_softmax(logits, -1).numpy(), atol=1e-4)
    out = run_genlm(
        "smc", "Once upon a time", "--particles", "2", "--max-tokens", "4", "--no-progress"
    )
    assert "posterior" in out, out


if __name__ == "__main__":
    main()
