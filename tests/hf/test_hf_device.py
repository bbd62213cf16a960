"""Rows on the model's device: torch rows from hf equal numpy rows equal a full forward, with no
extra copies. The CPU runs the same code the GPU does (``device_rows=True``); the cuda variants
skip without a GPU."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from genlm.backends.hf import HFLM

CONTEXTS = [(1, 403, 407), (1, 403, 407, 29), (1, 20), (1, 403, 407, 29, 300, 7, 8)]
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ),
]


def make(loaded, device="cpu", **kwargs) -> HFLM:
    model, tok = loaded("stories260K-fp64")
    return HFLM(model.to(device), tok, max_batch_size=8, **kwargs)


def rows_of(lm: HFLM, contexts, output: str):
    async def run():
        return await asyncio.gather(*(lm.next_token_logprobs(c, output=output) for c in contexts))

    return asyncio.run(run())


@pytest.mark.parametrize("device", DEVICES)
def test_torch_rows_equal_numpy_rows_equal_full_forward(loaded, check, device):
    model, _ = loaded("stories260K-fp64")
    on_device, on_host = make(loaded, device, device_rows=True), make(loaded, device)
    try:
        assert on_device.device_rows and on_device.device.type == device
        assert on_host.device_rows is (device != "cpu")  # the default: torch rows off the CPU
        torch_rows = rows_of(on_device, CONTEXTS, "torch")
        numpy_rows = rows_of(make(loaded, device, device_rows=False), CONTEXTS, "numpy")
        for context, t, n in zip(CONTEXTS, torch_rows, numpy_rows):
            assert isinstance(t, torch.Tensor) and t.device.type == device
            assert t.dtype == torch.float32 and t.shape == (len(on_device.vocab),)
            assert isinstance(n, np.ndarray) and n.dtype == np.float32
            np.testing.assert_array_equal(t.cpu().numpy(), n)
            check(model, context, n)
        # A numpy caller of the torch-row model gets the same float32 row, read-only.
        again = rows_of(on_device, CONTEXTS, "numpy")
        for n, a in zip(numpy_rows, again):
            assert isinstance(a, np.ndarray) and not a.flags.writeable
            np.testing.assert_array_equal(a, n)
    finally:
        on_device.close()
        on_host.close()
        model.to("cpu")


def test_torch_rows_are_not_copied(loaded):
    """A torch caller gets the cached tensor itself, each cached row owns exactly its own
    memory (the batch is not kept alive), and a numpy caller on the CPU gets a view of it."""
    lm = make(loaded, device_rows=True)
    try:
        first = rows_of(lm, CONTEXTS, "torch")
        second = rows_of(lm, CONTEXTS, "torch")
        width = len(lm.vocab)
        for a, b in zip(first, second):
            assert a.data_ptr() == b.data_ptr()
            assert a.untyped_storage().nbytes() == width * 4
        assert lm.output_cache.nbytes == len(CONTEXTS) * width * 4
        for t, n in zip(first, rows_of(lm, CONTEXTS, "numpy")):
            assert n.__array_interface__["data"][0] == t.data_ptr()
        batch = lm.batch_next_token_logprobs_sync(CONTEXTS, output="torch")
        assert isinstance(batch, torch.Tensor) and batch.shape == (len(CONTEXTS), width)
        np.testing.assert_array_equal(batch.numpy(), torch.stack(first).numpy())
    finally:
        lm.close()


def test_grouped_rows_come_back_in_request_order(loaded, check):
    """Rows with very different new-token counts run in separate forward passes; the batch
    still returns them in request order, for torch and numpy rows alike."""
    model, _ = loaded("stories260K-fp64")
    long = tuple(range(1, 60))
    contexts = [(1, 2), long, (1, 3), long[:-3] + (5, 6, 7)]
    for device_rows in (True, False):
        lm = make(loaded, device_rows=device_rows, max_forward_tokens=8)
        try:
            rows = lm.batch_next_token_logprobs_sync(contexts)
            assert lm.kv_stats["forwards"] > 1
            for context, row in zip(contexts, rows):
                check(model, context, row)
        finally:
            lm.close()
