"""Fixtures for the genlm.backend facade tests (the documented genlm-backend 0.3 API)."""

from __future__ import annotations

import pytest
from support.backend_guard import missing, skip_every_module

if absent := missing("torch", "transformers", "genlm.backend"):
    pytest_pycollect_makemodule = skip_every_module(f"{absent} is not installed")


@pytest.fixture(scope="module")
def hf_llm():
    """stories260K on the hf backend through the facade, in float32 on the CPU."""
    from genlm.backend import load_model_by_name

    llm = load_model_by_name("stories260K", backend="hf", llm_opts={"device": "cpu"})
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def reference():
    """An independent expectation: log_softmax of a plain uncached forward of stories260K."""
    import torch
    import transformers

    from genlm.core.backend import resolve_model_path

    model = transformers.AutoModelForCausalLM.from_pretrained(resolve_model_path("stories260K"))
    model = model.eval()

    def logprobs(context):
        with torch.inference_mode():
            logits = model(torch.tensor([context])).logits[0, -1].double()
        return torch.log_softmax(logits, dim=-1)

    return logprobs
