"""Rows and masses on the token LM's device: the byte LM asks for torch rows, the trie's torch
kernel computes the masses where the rows lie, and the results equal the host path and brute
force. On the CPU the same code runs on CPU tensors; the cuda variant skips without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from support.bytes_lms import assert_steps_match_brute_force, brute_force_next_symbol, run

from genlm.bytes import ByteLM
from genlm.core import Vocabulary
from genlm.core.mock import MockLM

torch = pytest.importorskip("torch")
DeviceVector = pytest.importorskip("genlm.bytes._device").DeviceVector

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ),
]


def test_device_vector_reads_like_its_numpy_array():
    values = np.random.default_rng(0).normal(size=50)
    v = DeviceVector(torch.from_numpy(values.copy()))
    assert v[7] == values[7] and isinstance(v[np.int64(7)], float)
    np.testing.assert_array_equal(v[3:9], values[3:9])
    ids = np.array([4, 0, 4, 49])
    np.testing.assert_array_equal(v[ids], values[ids])
    np.testing.assert_array_equal(v[ids[:0]], values[:0])
    np.testing.assert_array_equal(np.asarray(v), values)
    assert len(v) == 50 and v.shape == (50,) and v.nbytes == values.nbytes


def test_text_eos_on_device_rows_matches_brute_force():
    """The masked (text EOS) ids are handled on the device as on the host: every state's
    next-symbol distribution equals brute force over tokenizations and the host path."""
    tokens = (b"</s>", b"\n", b"\n\n", b"a", b"\n\na", b"aa")
    vocab = Vocabulary(tokens, special_ids={0}, eos_token_ids=(0,))
    eos = [b"</s>", b"\n\n", b"aa"]
    data, context = b"aa\n\naa\n", (3,)

    async def scenario():
        async with MockLM(vocab, seed=3) as lm:
            on_device = ByteLM(lm, K=None, eos=eos, device_rows=True)
            on_host = ByteLM(lm, K=None, eos=eos)
            assert not on_host.device_rows  # the mock keeps numpy rows
            eos_ids = set(on_device.eos_ids)
            dev, host = await on_device.initial(context), await on_host.initial(context)
            for i in range(len(data) + 1):
                expected = brute_force_next_symbol(lm, context, data[:i], eos_ids)
                got, want = await dev.logp_next(), await host.logp_next()
                np.testing.assert_allclose(np.exp(got.logprobs), expected, rtol=1e-9, atol=1e-12)
                np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=0, atol=1e-12)
                if i < len(data):
                    dev, host = await dev.advance(data[i]), await host.advance(data[i])
            for (_, eos_mode), entry in on_device.cache.items():
                assert isinstance(entry.lm_row, torch.Tensor)
                assert isinstance(entry.mass, DeviceVector) and entry.mass.tensor.dtype == (
                    torch.float64
                )
                if eos_mode:  # the text EOS ids never spell bytes
                    assert entry.logp[on_device.masked_ids(True)].max() == -np.inf

    run(scenario())


class Float64TorchLM:
    """Test-only LM handing the same float64 torch row after every context, on request."""

    def __init__(self, vocab: Vocabulary):
        self.vocab = vocab
        logits = torch.tensor(np.random.default_rng(1).normal(size=len(vocab)))
        self.row = torch.log_softmax(logits, 0)

    async def next_token_logprobs(self, ids, output="numpy"):
        assert output == "torch"
        return self.row


def test_float64_device_row_is_never_written_into():
    """Masking a text EOS id works on a copy: the LM's own (cached) row stays unchanged."""
    lm = Float64TorchLM(Vocabulary((b"a", b"\n\n", b"b")))
    before = lm.row.clone()

    async def scenario():
        byte_lm = ByteLM(lm, K=None, eos=[b"\n\n"], device_rows=True)
        state = await byte_lm.initial((0,))
        dist = await state.logp_next()
        p = np.exp(before.numpy())
        # After one token: byte 'a' is token 0, byte 'b' token 2, EOS token 1 (b"\n\n").
        got = np.exp(dist.logprobs[[ord("a"), ord("b"), 256, ord("\n")]])
        np.testing.assert_allclose(got, [p[0], p[2], p[1], 0.0], rtol=1e-12)

    run(scenario())
    assert torch.equal(lm.row, before)


class _TorchBufferLM:
    """Test-only LM filling one float64 tensor on each call and returning it (the torch twin
    of ``test_bytes_mass_cache._BufferLM``): a tensor cannot say it is read-only, so the
    byte LM must keep a clone."""

    def __init__(self, lm: MockLM):
        self.lm, self.vocab = lm, lm.vocab
        self.buffer = torch.empty(len(lm.vocab), dtype=torch.float64)

    async def next_token_logprobs(self, ids, output="numpy"):
        assert output == "torch"
        self.buffer.copy_(torch.from_numpy(self.next_token_logprobs_sync(ids)))
        return self.buffer

    def next_token_logprobs_sync(self, ids):
        """A fresh row, for the brute force."""
        return np.asarray(self.lm.next_token_logprobs_sync(ids), dtype=np.float64)


@pytest.mark.parametrize("eos", [[], [b"\n\n"]], ids=["nothing_masked", "text_eos"])
def test_a_device_row_the_lm_fills_again_is_cloned(eos):
    """Over an LM that refills one tensor per call, device rows give brute force's
    next-symbol distributions (the kept row was the LM's tensor: masses were recomputed,
    and log-probabilities read, from a later row)."""
    tokens = (b"\n", b"\n\n", b"a", b"\n\na")
    context, data, prompt = (2,), b"a\n\na\n\n\na", 4

    async def scenario():
        async with MockLM(Vocabulary(tokens), seed=5) as mock:
            lm = _TorchBufferLM(mock)
            byte_lm = ByteLM(lm, K=None, eos=eos, device_rows=True)
            await assert_steps_match_brute_force(lm, byte_lm, context, data, prompt)

    run(scenario())


@pytest.mark.parametrize("device", DEVICES)
def test_hf_device_rows_end_to_end(loaded_stories, device):
    """Over hf with device rows the byte LM asks for torch rows (automatically), keeps a
    copy of the LM's row holding exactly its own memory on the model's device (the LM's row
    is a view of its whole batch), computes float64 masses there, and its next-byte
    distributions equal those over the same model handing numpy rows."""
    from genlm.backends.hf import HFLM

    model, tok = loaded_stories
    data = b"Once upon a time, there was"
    on_device_lm = HFLM(model.to(device), tok, device_rows=True)
    on_host_lm = HFLM(model, tok, device_rows=False)

    async def scenario():
        on_device, on_host = ByteLM(on_device_lm, K=4), ByteLM(on_host_lm, K=4)
        assert on_device.device_rows and not on_host.device_rows
        dev, host = await on_device.initial(data), await on_host.initial(data)
        for byte in b" a":
            got, want = await dev.logp_next(), await host.logp_next()
            assert isinstance(got.logprobs, np.ndarray)
            np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=0, atol=1e-9)
            dev, host = await dev.advance(byte), await host.advance(byte)
        for (ctx, _), entry in on_device.cache.items():
            cached = await on_device_lm.next_token_logprobs(ctx, output="torch")
            assert torch.equal(entry.lm_row, cached) and entry.lm_row.device == cached.device
            assert entry.lm_row.untyped_storage().nbytes() == entry.lm_row.nbytes
            assert entry.mass.device.type == device and entry.logp.device.type == device

    try:
        run(scenario())
    finally:
        on_device_lm.close()
        on_host_lm.close()
        model.to("cpu")


@pytest.fixture(scope="module")
def loaded_stories():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("genlm.backends.hf")
    from genlm.core.backend import resolve_model_path

    path = resolve_model_path("stories260K")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    return model, tok
