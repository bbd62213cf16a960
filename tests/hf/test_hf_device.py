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
    on_device, default = make(loaded, device, device_rows=True), make(loaded, device)
    on_host = make(loaded, device, device_rows=False)
    try:
        assert on_device.device_rows and on_device.device.type == device
        assert default.device_rows is (device != "cpu")  # the default: torch rows off the CPU
        torch_rows = rows_of(on_device, CONTEXTS, "torch")
        numpy_rows = rows_of(on_host, CONTEXTS, "numpy")
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
        for lm in (on_device, default, on_host):
            lm.close()
        model.to("cpu")


def test_torch_rows_are_not_copied(loaded):
    """A torch caller gets the cached tensor itself, the rows of a batch are views of one
    tensor that the cache counts once, and a numpy caller on the CPU gets a view of it."""
    lm = make(loaded, device_rows=True)
    try:
        first = rows_of(lm, CONTEXTS, "torch")
        second = rows_of(lm, CONTEXTS, "torch")
        width = len(lm.vocab)
        for a, b in zip(first, second):
            assert a.data_ptr() == b.data_ptr()
        # the memory the rows keep alive: their batches, each exactly its rows
        storages = {a.untyped_storage().data_ptr(): a.untyped_storage().nbytes() for a in first}
        assert sum(storages.values()) == len(CONTEXTS) * width * 4
        # which the cache counts once per batch (plus the keys, which it also counts)
        from genlm.core.backend import Request, key_nbytes

        keys = sum(key_nbytes(Request(lm._variant(), tuple(c))) for c in CONTEXTS)
        assert lm.output_cache.nbytes == len(CONTEXTS) * width * 4 + keys
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


# ---- attention kernels and KV length buckets (issue 14.3) ------------------------------


class _Recorder:
    """Wraps a model: records each forward's attention-mask width and SDPA kernel flags."""

    def __init__(self, model):
        self.model = model
        self.widths: list[int] = []
        self.flags: list[tuple[bool, bool]] = []

    def __call__(self, *args, **kwargs):
        self.widths.append(kwargs["attention_mask"].shape[1])
        cuda = torch.backends.cuda
        self.flags.append((cuda.flash_sdp_enabled(), cuda.math_sdp_enabled()))
        return self.model(*args, **kwargs)


@pytest.mark.parametrize("name", ["stories260K-fp64", "tiny-llama-fp64"])
def test_bucketed_kv_lengths_match_full_forward(loaded, check, name):
    """SMC steps attend over KV lengths rounded up to the bucket (masked extra columns): the
    shapes repeat while contexts grow, pasts stay resident, rows equal a full forward."""
    model, tok = loaded(name)
    lm = HFLM(model, tok, cache_bytes=0, kv_length_multiple=16)
    recorder = lm.model = _Recorder(model)
    rng = np.random.default_rng(3)
    particles = [[1, *rng.integers(3, 200, 10).tolist()] for _ in range(3)]
    try:
        for _ in range(20):
            rows = lm.batch_next_token_logprobs_sync(particles)
            for particle, row in zip(particles, rows):
                check(model, particle, row)
                particle.append(int(rng.integers(3, 200)))
    finally:
        lm.close()
    assert all(w % 16 == 0 for w in recorder.widths)
    # Contexts of 11..30 tokens: KV lengths 11..30 fall in two buckets, 16 and 32.
    assert sorted(set(recorder.widths)) == [16, 32]
    assert lm.kv_stats["resident_rows"] >= 3 * 18


def test_cpu_defaults_keep_exact_lengths_and_torch_kernels(loaded):
    lm = make(loaded)
    try:
        assert lm.kv_length_multiple == 1 and lm.sdpa_backends is None
        recorder = lm.model = _Recorder(lm.model)
        lm.next_token_logprobs_sync([1, 2, 3, 4, 5])
        assert recorder.widths == [5]
    finally:
        lm.close()


def test_cuda_default_never_picks_cudnn():
    from torch.nn.attention import SDPBackend

    from genlm.backends.hf._model import _default_sdpa_backends

    chosen = _default_sdpa_backends(torch.device("cuda"))
    assert chosen[0] == SDPBackend.EFFICIENT_ATTENTION
    assert SDPBackend.CUDNN_ATTENTION not in chosen and SDPBackend.MATH in chosen
    assert _default_sdpa_backends(torch.device("cpu")) is None


def test_sdpa_backends_hold_during_the_forward_only(loaded, check):
    """``sdpa_backends=("math",)`` disables the other kernels while the model runs (and the
    rows stay exact); torch's flags are restored afterwards."""
    model, _ = loaded("stories260K-fp64")
    before = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    lm = make(loaded, sdpa_backends=("math",))
    recorder = lm.model = _Recorder(model)
    try:
        row = lm.next_token_logprobs_sync([1, 403, 407, 29])
        check(model, (1, 403, 407, 29), row)
    finally:
        lm.close()
    assert recorder.flags == [(False, True)]
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == (
        before
    )


@pytest.mark.parametrize(
    "options",
    [{"sdpa_backends": ("cudnn", "fast")}, {"sdpa_backends": ()}, {"kv_length_multiple": 0}],
)
def test_bad_attention_options_raise(loaded, options):
    with pytest.raises(ValueError, match="sdpa_backends|kv_length_multiple"):
        make(loaded, **options)
