"""The trie's torch kernel equals the float64 numpy/C kernel, and stays on the rows' device.

CPU tensors here; the same checks run on CUDA where a GPU is present (skipped otherwise).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.imports import modules_loaded_by
from support.random_llama import tokenizer_dir

from genlm.core import AsyncTokenByteTrie, TokenByteTrie, Vocabulary

torch = pytest.importorskip("torch")

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]
#: The two kernels add the same terms in other orders: float64 summation-order noise,
#: relative for masses, absolute for log-masses (a relative error of the mass).
RTOL = 1e-12

byte_strings = st.binary(min_size=0, max_size=5).map(lambda b: bytes(x % 4 for x in b))


@pytest.fixture(scope="module")
def gpt2_trie() -> TokenByteTrie:
    """The real GPT-2 vocabulary (50,257 tokens, EOS 50256)."""
    path = tokenizer_dir("gpt2")  # the committed fixture: this never skips
    vocab = list(Vocabulary.from_tokenizer_json(path).tokens)
    return TokenByteTrie(vocab, eos_token_ids=[50256])


def random_logprobs(rng: np.random.Generator, shape: tuple[int, ...], spread: float):
    """Normalized logprob rows, float32 as a model returns them, ``spread`` nats wide."""
    logits = rng.standard_normal(shape) * spread
    logits -= np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    return (logits - logits.max(-1, keepdims=True)).astype(np.float32)


def assert_same(result, expected: np.ndarray, device: str, log: bool = False) -> None:
    """``result`` is a float64 tensor on ``device`` equal to the numpy kernel's ``expected``.

    ``log``: the values are log-masses, compared in absolute terms.
    """
    assert isinstance(result, torch.Tensor)
    assert result.device.type == device and result.dtype == torch.float64
    got = result.cpu().numpy()
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected))
    finite = np.isfinite(expected)
    tol = {"rtol": 0, "atol": RTOL} if log else {"rtol": RTOL, "atol": 0}
    np.testing.assert_allclose(got[finite], expected[finite], **tol)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 3), spread=st.sampled_from([1, 8]))
def test_gpt2_rows_equal_the_float64_kernel(gpt2_trie, device, seed, batch, spread):
    """Sums, maxes and log forms of random float32 rows, batched and not, on gpt2."""
    lp = random_logprobs(np.random.default_rng(seed), (batch, gpt2_trie.vocab_size), spread)
    w = np.exp(lp.astype(np.float64)).astype(np.float32)
    t_lp, t_w = torch.from_numpy(lp).to(device), torch.from_numpy(w).to(device)
    trie = gpt2_trie
    # The reference sees the same float32 values, widened exactly to float64.
    assert_same(trie.batch_weight_sum(t_w), trie.batch_weight_sum(w.astype(np.float64)), device)
    assert_same(trie.batch_weight_max(t_w), trie.batch_weight_max(w.astype(np.float64)), device)
    assert_same(trie.batch_log_weight_sum(t_lp), trie.batch_log_weight_sum(lp), device, log=True)
    assert_same(trie.batch_log_weight_max(t_lp), trie.batch_log_weight_max(lp), device)
    assert_same(trie.weight_sum(t_w[0]), trie.weight_sum(w[0]), device)
    assert_same(trie.weight_max(t_w[0]), trie.weight_max(w[0]), device)
    assert_same(trie.log_weight_sum(t_lp[0]), trie.log_weight_sum(lp[0]), device, log=True)
    assert_same(trie.log_weight_max(t_lp[0]), trie.log_weight_max(lp[0]), device)


@pytest.mark.parametrize("device", DEVICES)
def test_log_sum_is_exact_far_below_the_row_max_and_for_masked_tokens(gpt2_trie, device):
    """Nodes 800 nats below the row max keep their mass; all -inf nodes are -inf."""
    rng = np.random.default_rng(5)
    lp = random_logprobs(rng, (2, gpt2_trie.vocab_size), 4).astype(np.float64)
    far = gpt2_trie.tokens_below(gpt2_trie.node_of(b"Hello"))
    lp[0, far] -= 800.0
    lp[1, gpt2_trie.tokens_below(gpt2_trie.node_of(b" the"))] = -np.inf
    expected = gpt2_trie.batch_log_weight_sum(lp)
    assert np.isfinite(expected[0, gpt2_trie.node_of(b"Hello")])
    result = gpt2_trie.batch_log_weight_sum(torch.from_numpy(lp).to(device))
    assert_same(result, expected, device, log=True)


@settings(max_examples=200, deadline=None)
@given(
    vocab=st.lists(byte_strings, min_size=1, max_size=30),
    data=st.data(),
)
def test_random_tries_equal_the_numpy_kernel(vocab, data):
    """Random vocabularies (holes, duplicates, EOS and atomic ids) and rows with -inf."""
    ids = st.sampled_from(range(len(vocab)))
    eos = data.draw(st.lists(ids, max_size=2))
    atomic = data.draw(st.lists(ids, max_size=3))
    trie = TokenByteTrie(vocab, eos_token_ids=eos, atomic_ids=atomic, kernel="numpy")
    values = st.one_of(st.floats(-30, 0), st.just(-np.inf))
    lp = np.array(data.draw(st.lists(values, min_size=len(vocab), max_size=len(vocab))))
    w = np.exp(lp)
    rows = torch.from_numpy(np.stack([lp, lp[::-1].copy()]))
    expected_sums = trie.batch_weight_sum(np.exp(rows.numpy()))
    assert_same(trie.batch_weight_sum(rows.exp()), expected_sums, "cpu")
    assert_same(trie.weight_max(torch.from_numpy(w)), trie.weight_max(w), "cpu")
    expected_logs = trie.batch_log_weight_sum(rows.numpy())
    assert_same(trie.batch_log_weight_sum(rows), expected_logs, "cpu", log=True)


def brute_log_sum(values: np.ndarray) -> float:
    """Brute force: a node's log-mass from its tokens' logprobs (NaN wins, then +inf)."""
    if np.isnan(values).any():
        return np.nan
    if np.isposinf(values).any():
        return np.inf
    values = values[np.isfinite(values)]
    top = values.max() if len(values) else -np.inf
    return top + np.log(np.exp(values - top).sum()) if len(values) else -np.inf


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=100, deadline=None)
@given(vocab=st.lists(byte_strings, min_size=1, max_size=30), data=st.data())
def test_log_sums_of_nan_and_inf_rows_equal_brute_force(device, vocab, data):
    """NaN and +inf reach exactly the nodes above them, as in the CPU kernels; the other
    nodes keep their exact log-mass (a NaN child was dropped by the shallow folds)."""
    trie = TokenByteTrie(vocab)
    values = st.one_of(st.floats(-800, 800), st.sampled_from([np.nan, np.inf, -np.inf]))
    lp = np.array(data.draw(st.lists(values, min_size=len(vocab), max_size=len(vocab))))
    below = [
        [i for i, b in enumerate(vocab) if b and b.startswith(trie.prefix(v))]
        for v in range(trie.num_nodes)
    ]
    want = np.array([brute_log_sum(lp[ids]) for ids in below])
    got = trie.log_weight_sum(torch.from_numpy(lp).to(device))
    assert got.device.type == device
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(trie.log_weight_sum(lp), want, rtol=1e-12, atol=1e-12)


def test_empty_vocabulary_is_a_root_of_no_mass():
    """A trie of no tokens: the torch kernel gives its root sum 0, and max and log sum -inf,
    as the CPU kernels do (``test_trie``)."""
    trie = TokenByteTrie([])
    row, rows = torch.zeros(0), torch.zeros(2, 0)
    for name, want in (("weight_sum", 0.0), ("weight_max", -np.inf), ("log_weight_sum", -np.inf)):
        np.testing.assert_array_equal(getattr(trie, name)(row).numpy(), [want])
        np.testing.assert_array_equal(getattr(trie, f"batch_{name}")(rows).numpy(), [[want]] * 2)


def test_wrong_shapes_are_rejected():
    trie = TokenByteTrie([b"a", b"b"])
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        trie.weight_sum(torch.ones(3))
    with pytest.raises(ValueError, match=r"shape \(B, 2\)"):
        trie.batch_weight_sum(torch.ones(2))


def test_complex_rows_are_refused():
    """Complex tensors are a TypeError, directly and through the async trie: the float64 cast
    dropped their imaginary parts (the async trie's without a warning)."""
    trie = TokenByteTrie([b"a", b"b"])
    row = torch.tensor([0.5, 0.5 + 1j])
    with pytest.raises(TypeError, match="weights must be real numbers, got torch.complex64"):
        trie.weight_sum(row)
    with pytest.raises(TypeError, match="real numbers"):
        trie.batch_log_weight_sum(row[None])

    async def main():
        async with AsyncTokenByteTrie(trie) as atrie:
            for weights in (row, row.numpy()):
                with pytest.raises(TypeError, match="real numbers"):
                    await atrie.weight_sum(weights)

    asyncio.run(main())


@pytest.mark.parametrize("device", DEVICES)
def test_async_trie_batches_torch_rows_on_their_device(device):
    """Concurrent torch rows are stacked into one call; each result is a row on the device."""
    vocab = [b"a", b"ab", b"abc", b"b", b"ba", b"", b"a"]
    trie = TokenByteTrie(vocab, eos_token_ids=[5])
    rows = torch.rand(6, len(vocab), dtype=torch.float64, device=device)

    async def main():
        async with AsyncTokenByteTrie(trie) as atrie:
            sums = await asyncio.gather(*(atrie.weight_sum(r) for r in rows))
            numpy_sums = await asyncio.gather(*(atrie.weight_sum(r.cpu().numpy()) for r in rows))
            return sums, numpy_sums, atrie.batcher.stats

    sums, numpy_sums, stats = asyncio.run(main())
    for row, got, want in zip(rows, sums, numpy_sums):
        assert_same(got, want, device)
        assert_same(got, trie.weight_sum(row.cpu().numpy()), device)
    assert stats["batches"] == 2  # torch rows and numpy rows never share a call


def async_sums(trie: TokenByteTrie, rows: list) -> list:
    """Concurrent ``weight_sum`` calls of an async trie over ``rows`` (errors returned)."""

    async def main():
        async with AsyncTokenByteTrie(trie) as atrie:
            calls = (atrie.weight_sum(row) for row in rows)
            return await asyncio.gather(*calls, return_exceptions=True)

    return asyncio.run(main())


def brute_sums(trie: TokenByteTrie, vocab: list[bytes], w) -> np.ndarray:
    """Brute force: the total weight of the tokens starting with each node's prefix."""
    w = np.asarray(w, dtype=np.float64)
    return np.array(
        [
            w[[i for i, b in enumerate(vocab) if b.startswith(trie.prefix(v))]].sum()
            for v in range(trie.num_nodes)
        ]
    )


def test_async_float8_row_is_widened_alone():
    """A float8 row is widened to float64 when it is submitted, so it batches with float32
    rows; all get their sums (torch cannot stack float8 with float32: the batch failed)."""
    vocab = [b"a", b"ab", b"b"]
    trie = TokenByteTrie(vocab)
    rows = [torch.tensor([0.5, 0.25, 0.125]), torch.tensor([0.0625, 1.0, 2.0])]
    float8 = torch.tensor([0.5, 1.0, 2.0]).to(torch.float8_e4m3fn)  # exactly representable
    first, eighth, last = async_sums(trie, [rows[0], float8, rows[1]])
    for got, w in ((first, rows[0]), (eighth, [0.5, 1.0, 2.0]), (last, rows[1])):
        assert isinstance(got, torch.Tensor), got
        np.testing.assert_array_equal(got.numpy(), brute_sums(trie, vocab, w))


@pytest.mark.filterwarnings("ignore:.*quantize_per_tensor:UserWarning")
def test_async_torch_row_that_is_not_float_fails_alone():
    """A quantized row (not readable as float64) fails its own call with a TypeError; the
    rows batched with it get their sums."""
    if not hasattr(torch, "quantize_per_tensor"):
        pytest.skip("this torch has no quantized tensors")
    vocab = [b"a", b"ab", b"b"]
    trie = TokenByteTrie(vocab)
    rows = [torch.tensor([0.5, 0.25, 0.125]), torch.tensor([0.0625, 1.0, 2.0])]
    quantized = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    first, error, last = async_sums(trie, [rows[0], quantized, rows[1]])
    for got, w in ((first, rows[0]), (last, rows[1])):
        assert isinstance(got, torch.Tensor), got
        np.testing.assert_array_equal(got.numpy(), brute_sums(trie, vocab, w))
    assert isinstance(error, TypeError) and "float64" in str(error)


def test_core_and_the_numpy_path_never_import_torch():
    """torch loads only when a caller hands the trie a torch tensor."""
    numpy_path = (
        "import numpy as np, genlm.core\n"
        "t = genlm.core.TokenByteTrie([b'a', b'ab'], eos_token_ids=[1])\n"
        "t.weight_sum(np.ones(2)); t.batch_log_weight_sum(np.zeros((2, 2)))\n"
        "import asyncio\n"
        "async def go():\n"
        "    async with genlm.core.AsyncTokenByteTrie(t) as a:\n"
        "        await a.weight_max(np.ones(2))\n"
        "asyncio.run(go())"
    )
    assert modules_loaded_by("import genlm.core", ["torch"]) == []
    assert modules_loaded_by(numpy_path, ["torch"]) == []
