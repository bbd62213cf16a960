"""The published ``genlm.bytes.trie`` API against brute force (issue 13 item 2)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.bytes_lms import run

from genlm.bytes import AsyncTokenByteTrie, TokenByteTrie, TrieMode

_token = st.lists(st.sampled_from(b"ab\n"), min_size=1, max_size=3).map(bytes)
_tokens = st.lists(_token, min_size=1, max_size=10)


def brute_sums(trie: TokenByteTrie, w: np.ndarray, with_eos: bool, atomic: set[bytes]):
    """Per node: the summed weight of the tokens whose bytes start with its prefix."""
    eos = set(trie.eos_token_ids) if with_eos else set()
    out = []
    for prefix in trie.node2prefix[:-1]:
        out.append(
            sum(
                w[i]
                for i, t in enumerate(trie.decode)
                if t.startswith(prefix) and i not in eos and t not in atomic
            )
        )
    eos_mass = sum(w[i] for i in eos)
    out[trie.root] += eos_mass
    return np.array([*out, eos_mass])


@settings(max_examples=40, deadline=None)
@given(
    tokens=_tokens,
    n_eos=st.integers(0, 2),
    atomic_first=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_weight_sum_and_max_match_brute_force(tokens, n_eos, atomic_first, seed):
    """Both modes: each node holds the weight of the tokens spelling its prefix, the last
    node the EOS tokens' (WITH_EOS only); maxima likewise; the async trie agrees."""
    decode = [b"<special>", *tokens]
    eos_tokens = list(dict.fromkeys(tokens))[:n_eos]
    atomic = {b"<special>"} if atomic_first else set()
    trie = TokenByteTrie(decode, eos_tokens=eos_tokens, atomic_tokens=list(atomic))
    w = np.random.default_rng(seed).random(len(decode))
    for mode, with_eos in ((TrieMode.WITHOUT_EOS, False), (None, False), (TrieMode.WITH_EOS, True)):
        got = trie.weight_sum(w, mode)
        np.testing.assert_allclose(got, brute_sums(trie, w, with_eos, atomic), atol=1e-12)
    got_max = trie.weight_max(w)
    for v, prefix in enumerate(trie.node2prefix[:-1]):
        below = [w[i] for i, t in enumerate(decode) if t.startswith(prefix) and t not in atomic]
        assert got_max[v] == (max(below) if below else -np.inf)

    async def scenario():
        async_trie = AsyncTokenByteTrie.from_vocab(decode, eos_tokens=eos_tokens)
        try:
            got = await async_trie.weight_sum(w, TrieMode.WITH_EOS)
            np.testing.assert_allclose(got, trie.weight_sum(w, TrieMode.WITH_EOS), atol=1e-12)
            np.testing.assert_array_equal(await async_trie.weight_max(w), trie.weight_max(w))
        finally:
            await async_trie.cleanup()

    if not atomic:  # the async trie above was built without atomic tokens
        run(scenario())


def test_torch_tensors_are_accepted_and_results_are_numpy():
    torch = pytest.importorskip("torch")
    trie = TokenByteTrie([b"a", b"ab", b"b"], eos_tokens=[b"b"])
    w = torch.tensor([0.2, 0.3, 0.5])
    got = trie.weight_sum(w, TrieMode.WITH_EOS)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    by_prefix = dict(zip(trie.node2prefix[:-1], got[:-1].tolist()))
    # b"b" keeps its node; WITH_EOS moves its weight to the EOS node.
    assert by_prefix == pytest.approx({b"": 1.0, b"a": 0.5, b"ab": 0.3, b"b": 0.0})
    assert got[trie.eos_node] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="Invalid device"):
        TokenByteTrie([b"a"], device="tpu")
    with pytest.raises(ValueError, match="weights"):
        trie.weight_sum(np.ones(2))


def test_bfloat16_tensors_and_lists_of_tensors_are_read_as_their_values():
    """0.2.0 took any tensor and lists of them: bfloat16 rows (numpy cannot read them), a
    batch tensor and a list of row tensors give the float64 sums of the same values."""
    torch = pytest.importorskip("torch")
    trie = TokenByteTrie([b"a", b"ab", b"b"], eos_tokens=[b"b"])
    rows = torch.tensor([[0.25, 0.5, 0.125], [0.5, 0.25, 0.0625]], dtype=torch.bfloat16)
    values = rows.float().numpy().astype(np.float64)  # bfloat16 holds these exactly
    expected = trie.batch_weight_sum(values, TrieMode.WITH_EOS)
    np.testing.assert_array_equal(trie.batch_weight_sum(rows, TrieMode.WITH_EOS), expected)
    np.testing.assert_array_equal(trie.batch_weight_sum(list(rows), TrieMode.WITH_EOS), expected)
    np.testing.assert_array_equal(trie.weight_sum(rows[1], TrieMode.WITH_EOS), expected[1])
    np.testing.assert_array_equal(trie.batch_weight_max(rows), trie.batch_weight_max(values))
    with pytest.raises(TypeError, match="must be real"):
        trie.weight_sum(torch.ones(3, dtype=torch.complex64))
    with pytest.raises(TypeError, match="must be real"):
        trie.weight_sum(np.ones(3, dtype=complex))


@pytest.mark.parametrize("shape", [(2, 3), (1, 3), (3, 1), ()], ids=repr)
def test_single_row_methods_refuse_other_shapes(shape):
    """weight_sum and weight_max take one row, as documented (and as 0.2.0 and genlm-core's
    trie refuse more): given a (2, 3) batch they returned row 0's masses and dropped row 1,
    and the async weight_sum failed with numpy's concatenation error."""
    trie = TokenByteTrie([b"a", b"ab", b"b"], eos_tokens=[b"b"])
    w = np.full(shape, 0.25)
    says = rf"expected one row of weights of shape \(3,\), got {re.escape(str(w.shape))}"
    for method in (trie.weight_sum, trie.weight_max):
        with pytest.raises(ValueError, match=says):
            method(w)

    async def scenario():
        async_trie = AsyncTokenByteTrie(trie)
        try:
            for method in (async_trie.weight_sum, async_trie.weight_max):
                with pytest.raises(ValueError, match=says):
                    await method(w)
        finally:
            await async_trie.cleanup()

    run(scenario())


def test_released_keyword_names_are_the_documented_options():
    """genlm-bytes 0.2.0's eos_byte_strings/atomic_byte_strings/eot_sentinel (as genlm-control
    calls them) mean eos_tokens/atomic_tokens/eot_token, also through from_vocab; both names
    with different values are refused."""
    decode = [b"a", b"ab", b"\n\n", b"</s>"]
    w = np.array([0.1, 0.2, 0.3, 0.4])
    documented = TokenByteTrie(decode, eos_tokens=[b"</s>"], atomic_tokens=[b"ab"], eot_token=b"")
    released = TokenByteTrie(
        decode, eos_byte_strings=[b"</s>"], atomic_byte_strings=[b"ab"], eot_sentinel=b""
    )
    assert released.eos_token_ids == documented.eos_token_ids == [3]
    assert released.eos_byte_strings == released.eos_tokens == {b"</s>"}
    assert released.eot_sentinel == released.eot_token == b""
    # b"ab" atomic: its 0.2 weight counts at no prefix node; b"</s>" goes to the EOS node.
    by_prefix = dict(zip(released.node2prefix[:-1], released.weight_sum(w, TrieMode.WITH_EOS)))
    assert by_prefix[b"a"] == pytest.approx(0.1)
    for mode in (TrieMode.WITHOUT_EOS, TrieMode.WITH_EOS):
        np.testing.assert_array_equal(released.weight_sum(w, mode), documented.weight_sum(w, mode))
    both = TokenByteTrie(decode, eos_tokens=[b"</s>"], eos_byte_strings={b"</s>"})
    assert both.eos_token_ids == [3]
    with pytest.raises(ValueError, match="eos_tokens and eos_byte_strings"):
        TokenByteTrie(decode, eos_tokens=[b"</s>"], eos_byte_strings=[b"\n\n"])
    with pytest.raises(ValueError, match="atomic_tokens and atomic_byte_strings"):
        TokenByteTrie(decode, atomic_tokens=[b"ab"], atomic_byte_strings=[b"a"])
    with pytest.raises(TypeError, match="eos_byte_strings must be a list of byte strings"):
        TokenByteTrie(decode, eos_byte_strings=b"</s>")

    async def scenario():
        async_trie = AsyncTokenByteTrie.from_vocab(decode, eos_byte_strings=[b"</s>"])
        try:
            assert async_trie.trie.eos_token_ids == [3]
            got = await async_trie.weight_sum(w, TrieMode.WITH_EOS)
            assert got[async_trie.trie.eos_node] == pytest.approx(0.4)
        finally:
            await async_trie.cleanup()

    run(scenario())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eos_tokens": [b"</S>"]}, r"EOS byte string b'</S>' is not the bytes of any token"),
        ({"eos_byte_strings": [b"</s>", b"zz"]}, r"EOS byte string b'zz'"),
        ({"atomic_tokens": [b"zz"]}, r"atomic byte string b'zz' is not the bytes of any token"),
        ({"atomic_byte_strings": [b"b"]}, r"atomic byte string b'b'"),
    ],
)
def test_byte_strings_that_spell_no_token_are_refused(kwargs, message):
    """An EOS string no token spells would leave the trie silently without EOS (and an
    unknown atomic token is a typo too): both raise, naming the string."""
    with pytest.raises(ValueError, match=message):
        TokenByteTrie([b"a", b"ab", b"</s>"], **kwargs)


def test_an_empty_vocabulary_is_refused():
    """A trie of no tokens has nothing to sum: refused when built, not at the first call."""
    with pytest.raises(ValueError, match="vocabulary .decode. is empty"):
        TokenByteTrie([])
    with pytest.raises(ValueError, match="vocabulary .decode. is empty"):
        AsyncTokenByteTrie.from_vocab([], eos_tokens=[])


@pytest.mark.parametrize(
    ("decode", "message"),
    [
        ([b"a", 2], r"decode\[1\] is int 2, not bytes"),
        ([b"a", None], r"decode\[1\] is None, not bytes"),
        ([b"a", "b"], r"decode\[1\] is str 'b', not bytes"),
        (b"ab", r"decode must be a list of byte strings.*got one bytes b'ab'"),
        ("ab", r"decode must be a list of byte strings.*got one str 'ab'"),
    ],
    ids=repr,
)
def test_a_decode_entry_that_is_not_bytes_is_refused(decode, message):
    """decode's entries must be bytes, as genlm-core's trie's must: bytes(2) made token 1
    two NUL bytes, and a bytes object given as the whole vocabulary was read as ints."""
    with pytest.raises(TypeError, match=message):
        TokenByteTrie(decode)
    with pytest.raises(TypeError, match=message):
        AsyncTokenByteTrie.from_vocab(decode)


def test_bytes_subclass_tokens_are_plain_bytes_in_decode():
    """genlm-backend's Token (a bytes subclass) is taken, stored as plain bytes."""

    class Token(bytes):
        pass

    assert [type(t) for t in TokenByteTrie([Token(b"a"), b"b"]).decode] == [bytes, bytes]
