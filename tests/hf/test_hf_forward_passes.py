"""What each forward pass sees (issue 21): no unwritten KV column, and no more new tokens than
``max_forward_tokens``. Rows are held to a plain full forward of the same model and, for
chunked prefills, to the unsplit forward of the same batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genlm.backends.hf import HFLM

FP64 = ["stories260K-fp64", "tiny-llama-fp64"]
#: fp64 models: the only allowed difference is the float32 rounding of the returned row.
ATOL, RTOL = 1e-12, 1.2e-7


@pytest.fixture
def nan_memory():
    """Uninitialized memory reads as NaN: deterministic mode fills ``torch.empty`` with NaN.

    On CUDA a read of never-written KV gets whatever memory was left there; here it is NaN,
    which no masked attention weight (exactly 0) can hide.
    """
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    torch.utils.deterministic.fill_uninitialized_memory = fill


class _Recorder:
    """Wraps a model: records each forward's ``(rows, new tokens)`` and attention-mask width."""

    def __init__(self, model):
        self.model = model
        self.shapes: list[tuple[int, int]] = []
        self.widths: list[int] = []

    def __call__(self, *args, **kwargs):
        self.shapes.append(tuple(kwargs["input_ids"].shape))
        self.widths.append(kwargs["attention_mask"].shape[1])
        return self.model(*args, **kwargs)


def recorded(loaded, name: str, **kwargs) -> tuple[HFLM, _Recorder]:
    model, tok = loaded(name)
    lm = HFLM(model, tok, cache_bytes=0, max_batch_size=16, **kwargs)
    recorder = lm.model = _Recorder(model)
    return lm, recorder


def random_ids(rng, lm: HFLM, n: int) -> list[int]:
    return [int(t) for t in rng.integers(3, min(len(lm.vocab), 500), n)]


def unsplit_rows(loaded, name: str, contexts) -> list[np.ndarray]:
    """The same batch, each group in one pass (the default bound is far above these sizes)."""
    model, tok = loaded(name)
    lm = HFLM(model, tok, cache_bytes=0)
    try:
        return lm.batch_next_token_logprobs_sync(contexts)
    finally:
        lm.close()


# ---- issue 21.2: bucket columns are never read unwritten ------------------------------


@pytest.mark.parametrize("name", FP64)
def test_bucket_columns_are_written_before_they_are_attended(loaded, check, nan_memory, name):
    """A 64-token context fills its bucket exactly, so the kept buffer has columns no pass
    wrote; one more token attends over the next bucket, those columns included. Then a wider
    batch (a fresh buffer) with rows of mixed lengths."""
    model, _ = loaded(name)
    lm, _ = recorded(loaded, name, kv_length_multiple=64)
    rng = np.random.default_rng(21)
    context = random_ids(rng, lm, 64)
    steps = [
        [context],
        [context + [5]],
        [context + [5, 6], random_ids(rng, lm, 10), context[:30] + [7]],
    ]
    try:
        for contexts in steps:
            for c, row in zip(contexts, lm.batch_next_token_logprobs_sync(contexts)):
                check(model, c, row)
    finally:
        lm.close()
