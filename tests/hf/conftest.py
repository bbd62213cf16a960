"""Fixtures for the hf backend tests: offline models and the independent expectation."""

from __future__ import annotations

import numpy as np
import pytest
from support.backend_guard import missing, skip_every_module
from support.random_llama import cached_random_llama

from genlm.core.backend import resolve_model_path

if absent := missing("torch", "transformers"):
    pytest_pycollect_makemodule = skip_every_module(f"{absent} is not installed")
else:
    import torch
    import transformers

#: Tolerances against an uncached full forward, per test model. Two fp32 computations of the
#: same logits with different batch shapes differ by float32 noise: the *plain* fp32 forward is
#: itself up to 1.05e-5 (stories260K) and 6e-5 or more (the random tiny Llama, whose initializer
#: range 0.5 makes it chaotic) away from the same forward in fp64, so an fp32 result cannot be held
#: to 1e-5 against another fp32 result in general. Each model is therefore tested twice: in fp64,
#: where the only allowed difference is the float32 rounding of the returned row (this pins the
#: KV, padding and position logic down exactly, far below 1e-5), and in fp32 at its noise floor.
#: name -> (directory, dtype, atol, rtol)
STORIES = lambda: resolve_model_path("stories260K")  # noqa: E731
TINY = lambda: str(cached_random_llama("tiny"))  # noqa: E731
MODELS = {
    "stories260K-fp64": (STORIES, "float64", 1e-12, 1.2e-7),
    "stories260K-fp32": (STORIES, "float32", 5e-5, 0.0),
    "tiny-llama-fp64": (TINY, "float64", 1e-12, 1.2e-7),
    "tiny-llama-fp32": (TINY, "float32", 1e-3, 0.0),
}
_TOLERANCE: dict[int, tuple[float, float]] = {}


@pytest.fixture(scope="session")
def loaded():
    """Load each test model and tokenizer once per session (read-only: never wrap them)."""
    cache = {}

    def load(name):
        if name not in cache:
            path, dtype, atol, rtol = MODELS[name]
            path = path()
            tok = transformers.AutoTokenizer.from_pretrained(path)
            model = transformers.AutoModelForCausalLM.from_pretrained(path)
            model = model.to(getattr(torch, dtype)).eval()
            _TOLERANCE[id(model)] = (atol, rtol)
            cache[name] = (model, tok)
        return cache[name]

    return load


def full_forward(model, context) -> np.ndarray:
    """The independent expectation: log_softmax of a plain, uncached full forward, over all
    of the model's logits (padding beyond the tokenizer's tokens included).

    The input goes to the model's device, so this also runs where the model is on a GPU.
    """
    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(torch.tensor([list(context)], device=device)).logits[0, -1]
    return torch.log_softmax(logits, -1).double().cpu().numpy()


def assert_matches(model, context, row) -> None:
    # Rows are as wide as the model's logits (a row of another width fails the shape check).
    expected = full_forward(model, context)
    atol, rtol = _TOLERANCE.get(id(model), (1e-5, 0.0))
    np.testing.assert_allclose(np.asarray(row, dtype=np.float64), expected, atol=atol, rtol=rtol)


@pytest.fixture
def reference():
    """``reference(model, context)``: the full-forward log-probabilities (float64 array)."""
    return full_forward


@pytest.fixture
def check():
    """``check(model, context, row)`` asserts ``row`` equals the full forward of ``context``."""
    return assert_matches
