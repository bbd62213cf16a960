"""genlm.backend.trie: the documented node layout, checked against brute-force masses."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from genlm.backend.tokenization import Token
from genlm.backend.trie import (
    AsyncTokenCharacterTrie,
    ParallelTokenCharacterTrie,
    TokenCharacterTrie,
)


class End:
    """A non-bytes vocabulary entry, like genlm-control's EOS: iterates as itself."""

    def __iter__(self):
        return iter([self])

    def __hash__(self):
        return 1

    def __eq__(self, other):
        return isinstance(other, End)


VOCAB = [b"cat", b"cats", b"dog", b"dogs", b"ca", b"", b"do", b"cat"]


def walk(trie, word):
    """Follow a word's letters, then its leaf marker, from the root."""
    node = trie.root
    for letter in word:
        node = trie.children[node][letter]
    return node


def below(trie, node):
    """Positions of the entries whose leaves are below ``node`` (brute force over the layout)."""
    leaf_pos = {leaf: p for p, leaf in enumerate(trie.token_id_to_leaf[:, 1].tolist())}
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if n in leaf_pos:
            out.append(leaf_pos[n])
        stack.extend(trie.children[n].values())
    return out


@pytest.mark.parametrize("cls", [TokenCharacterTrie, ParallelTokenCharacterTrie])
def test_layout_and_masses_match_brute_force(cls):
    tokens = [Token(i, b) for i, b in enumerate(VOCAB)] + [End()]
    trie = cls(tokens)
    assert trie.decode == tokens and trie.root == 0
    for p, entry in enumerate(tokens):
        if isinstance(entry, Token):
            key, letters, tid = (entry.byte_string, entry.token_id), list(entry.byte_string), p
        else:
            key, letters, tid = entry, [entry], p
        parent = walk(trie, letters)
        leaf = trie.children[parent][(None, p)]
        assert trie.word2leaf[key] == leaf and trie.leaf2word[leaf] == key
        assert trie.token_id_to_leaf[p].tolist() == [tid, leaf]
    rng = np.random.default_rng(0)
    ws = rng.random((3, len(tokens)))
    ws[0, 2] = 0.0
    sums, maxes = trie.batch_weight_sum(ws), trie.batch_weight_max(torch.tensor(ws))
    for b in range(3):
        single = trie.weight_sum(ws[b])
        np.testing.assert_allclose(single, sums[b], rtol=1e-15, atol=0)
        for node in range(trie.num_nodes):
            members = below(trie, node)
            assert single[node] == pytest.approx(ws[b, members].sum(), rel=1e-14)
            expected_max = ws[b, members].max() if members else -np.inf
            assert maxes[b, node] == expected_max
    assert sums[0, trie.root] == pytest.approx(ws[0].sum(), rel=1e-14)


def test_plain_bytes_and_str_entries_are_keyed_by_themselves():
    """Bytes edges are ints, str edges are characters; plain entries are their own keys."""
    trie = TokenCharacterTrie(["ab", b"a", b"ab", "a", End()])
    assert trie.decode[0] == "ab" and trie.decode[1] == b"a"
    for position, entry in enumerate(trie.decode):
        leaf = trie.children[walk(trie, list(entry))][(None, position)]
        assert trie.word2leaf[entry] == leaf
    ws = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    sums, maxes = trie.weight_sum(ws), trie.weight_max(ws)
    assert sums[trie.root] == 31.0 and maxes[trie.root] == 16.0
    assert sums[walk(trie, [97])] == 6.0 and sums[walk(trie, ["a"])] == 9.0
    assert maxes[walk(trie, ["a", "b"])] == 1.0
    with pytest.raises(ValueError, match="weights"):
        trie.weight_sum([1.0, 2.0])


@pytest.mark.parametrize(
    "vocab",
    [
        [Token(1, b"a"), b"a"],  # Token id 1 and a plain entry at position 1, one node
        [Token(7, b"x"), Token(1, b""), "EOS"],  # a decode_vocab subset and a word
        [Token(1, b""), ""],  # an empty Token and an empty word, both at the root
        [Token(5, b"ab"), Token(0, b"ab"), b"ab", "ab"],
    ],
)
def test_every_entry_has_its_own_leaf_keyed_by_position(vocab):
    """Each entry's leaf hangs off its last node under ``(None, position)``, as in
    genlm-backend 0.3.1, so every leaf is reachable through ``children`` (a Token's leaf was
    keyed by its id and a plain entry's by its position: the two collided, one leaf lost)."""
    trie = TokenCharacterTrie(vocab)
    reachable, stack = {}, [trie.root]
    while stack:
        node = stack.pop()
        for key, child in trie.children[node].items():
            if isinstance(key, tuple) and key[0] is None:
                reachable[key[1]] = child
            else:
                stack.append(child)
    assert sorted(reachable) == list(range(len(vocab)))
    for position, entry in enumerate(vocab):
        key = (entry.byte_string, entry.token_id) if isinstance(entry, Token) else entry
        assert reachable[position] == trie.word2leaf[key]
        assert trie.children[walk(trie, list(entry))][(None, position)] == reachable[position]
    ws = np.arange(1.0, len(vocab) + 1)
    assert trie.weight_sum(ws)[trie.root] == ws.sum()
    # 0.3.1's names: (position, leaf) rows, and each node's letters from the root.
    assert trie.idx_to_leaf.dtype == np.int32
    assert trie.idx_to_leaf.tolist() == [[p, reachable[p]] for p in range(len(vocab))]
    for position, entry in enumerate(vocab):
        assert trie.node2prefix[reachable[position]] == list(entry)
    for node, letters in trie.node2prefix.items():
        if node not in reachable.values():
            assert walk(trie, letters) == node
    assert len(trie.node2prefix) == trie.num_nodes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_cpu_tensors_of_any_float_dtype(dtype):
    """CPU tensors numpy cannot hold (bfloat16, float8) give the sums and maxes of their
    values, one row, a batch, or through the async trie (``tensor.numpy()`` raised
    TypeError for them; core's trie takes them)."""
    trie = TokenCharacterTrie([Token(i, b) for i, b in enumerate(VOCAB)] + [End()])
    values = 2.0 ** -np.arange(len(trie.decode))  # powers of two: exact in every dtype
    rows = np.stack([values, values[::-1]])
    tensor = torch.tensor(rows).to(dtype)

    def check(sums, maxes, w):
        for node in range(trie.num_nodes):
            members = below(trie, node)
            assert sums[node] == pytest.approx(w[members].sum(), rel=1e-15)
            assert maxes[node] == (w[members].max() if members else -np.inf)

    check(trie.weight_sum(tensor[0]), trie.weight_max(tensor[0]), rows[0])
    for b, (sums, maxes) in enumerate(
        zip(trie.batch_weight_sum(tensor), trie.batch_weight_max(tensor))
    ):
        check(sums, maxes, rows[b])

    async def run():
        atrie = AsyncTokenCharacterTrie(trie)
        out = await asyncio.gather(atrie.weight_sum(tensor[1]), atrie.weight_max(tensor[1]))
        await atrie.cleanup()
        return out

    check(*asyncio.run(run()), rows[1])


DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("cls", [TokenCharacterTrie, ParallelTokenCharacterTrie])
def test_a_batch_may_be_a_list_of_tensor_rows(cls, dtype, device):
    """A batch given as a list (or tuple) of tensor rows, as genlm-backend 0.3.1 documents
    (``list[torch.Tensor|np.ndarray]``), gives the masses of the float32 rows of the same
    values: numpy, which stacked the list, raised TypeError for bfloat16 and device rows."""
    trie = cls([Token(i, b) for i, b in enumerate(VOCAB)] + ["do", End()])
    rng = np.random.default_rng(3)
    rows = [torch.tensor(rng.random(len(trie.decode))).to(dtype) for _ in range(3)]
    same_values = torch.stack(rows).float().numpy()
    on_device = [row.to(device) for row in rows]
    for batch in (on_device, tuple(on_device)):
        np.testing.assert_allclose(
            trie.batch_weight_sum(batch), trie.batch_weight_sum(same_values), rtol=1e-12
        )
        np.testing.assert_array_equal(
            trie.batch_weight_max(batch), trie.batch_weight_max(same_values)
        )
    mixed = [on_device[0], same_values[1], rows[2]]  # read on the host, row by row
    np.testing.assert_allclose(
        trie.batch_weight_sum(mixed), trie.batch_weight_sum(same_values), rtol=1e-12
    )


def test_a_list_of_rows_must_be_a_batch_of_real_rows():
    """Tensor rows of different lengths are a ValueError naming the shapes; complex rows
    (tensors or arrays) a TypeError, where torch dropped the imaginary parts silently."""
    trie = TokenCharacterTrie([Token(i, b) for i, b in enumerate(VOCAB)])
    V = len(VOCAB)
    with pytest.raises(ValueError, match="differ in shape"):
        trie.batch_weight_sum([torch.ones(V), torch.ones(V - 1)])
    complex_row = torch.ones(V, dtype=torch.complex64)
    complex_array = complex_row.numpy()
    for ws in (
        [torch.ones(V), complex_row],
        [np.ones(V), complex_row],
        complex_row[None],
        [np.ones(V), complex_array],  # no tensor: numpy makes the batch
    ):
        with pytest.raises(TypeError, match="real numbers"):
            trie.batch_weight_sum(ws)
    with pytest.raises(TypeError, match="real numbers"):
        trie.weight_max(complex_row.numpy())


def test_async_trie_batches_and_equals_the_sync_trie():
    trie = TokenCharacterTrie([Token(i, b) for i, b in enumerate(VOCAB)] + [End()])
    rng = np.random.default_rng(1)
    rows = rng.random((5, len(trie.decode)))

    async def run():
        atrie = AsyncTokenCharacterTrie(trie)
        out = await asyncio.gather(
            *(atrie.weight_sum(r) for r in rows), *(atrie.weight_max(r) for r in rows)
        )
        await atrie.cleanup()
        return out

    out = asyncio.run(run())
    for r, s, m in zip(rows, out[:5], out[5:]):
        np.testing.assert_array_equal(s, trie.weight_sum(r))
        np.testing.assert_array_equal(m, trie.weight_max(r))


def test_async_trie_reads_a_row_when_called():
    """A caller refilling its buffer while a call waits gets the masses of the row it
    passed: the leaves were read after the wait (the new row's) and the prefixes from core's
    copy (the old row's), so leaves no longer summed to their parents."""
    trie = TokenCharacterTrie([Token(i, b) for i, b in enumerate(VOCAB)])
    row = np.arange(1.0, len(VOCAB) + 1)

    async def run():
        atrie = AsyncTokenCharacterTrie(trie, max_wait_s=0.05)
        buffer = row.copy()
        waiting = asyncio.create_task(atrie.weight_sum(buffer))
        await asyncio.sleep(0)  # submitted
        buffer[:] = 100.0  # refilled for the next call
        out = await waiting
        await atrie.cleanup()
        return out

    np.testing.assert_array_equal(asyncio.run(run()), trie.weight_sum(row))


@pytest.mark.parametrize("weights", [["1", "2"], np.array([1.0, None], dtype=object)])
def test_weights_that_are_not_numbers_are_refused(weights):
    """Numeric strings and None are a TypeError (as core's tries and 0.3.1 refuse them);
    numpy read "1" as 1.0 and None as NaN."""
    trie = TokenCharacterTrie([Token(0, b"a"), Token(1, b"b")])
    with pytest.raises(TypeError, match="array of numbers"):
        trie.weight_sum(weights)


@pytest.mark.parametrize("not_a_trie", [[b"a", b"b"], None, "ab"])
def test_async_trie_refuses_what_is_not_a_trie_at_construction(not_a_trie):
    """A vocabulary is a TypeError naming what to pass, where every later call failed with
    an AttributeError from inside ('list' object has no attribute '_weights')."""
    with pytest.raises(TypeError, match="trie must be a TokenCharacterTrie"):
        AsyncTokenCharacterTrie(not_a_trie)


def test_visualize_draws_every_node():
    graphviz = pytest.importorskip("graphviz")
    trie = TokenCharacterTrie([b"cat", b"cats", b"dog"])
    dot = trie.visualize([0.4, 0.1, 0.5])
    assert isinstance(dot, graphviz.Digraph)
    assert (
        sum(line.strip().startswith(tuple("0123456789")) and "->" not in line for line in dot.body)
        == trie.num_nodes
    )


def test_visualize_labels_nodes_with_per_node_masses():
    """genlm-backend's README draws ``trie.visualize(mass)`` with the masses a sum returned,
    one per node (it was refused: per-entry weights were the only form); per-entry weights
    give the same picture."""
    pytest.importorskip("graphviz")
    trie = TokenCharacterTrie([b"cat", b"cats", b"dog"])
    mass = trie.weight_sum([0.4, 0.1, 0.5])
    drawn = trie.visualize(mass)
    assert drawn.source == trie.visualize([0.4, 0.1, 0.5]).source
    assert "0.5" in drawn.source and f"{mass[0]:.3g}" == "1"


def test_async_trie_from_vocab_and_after_cleanup():
    """from_vocab picks the sequential or parallel trie (another name is a ValueError), and
    a trie cleaned up serves again, as genlm-backend's restarts (ours raised
    ModelClosedError)."""
    vocab = [Token(i, b) for i, b in enumerate(VOCAB)]
    assert type(AsyncTokenCharacterTrie.from_vocab(vocab, "sequential").trie) is TokenCharacterTrie
    parallel = AsyncTokenCharacterTrie.from_vocab(vocab)
    assert type(parallel.trie) is ParallelTokenCharacterTrie
    with pytest.raises(ValueError, match="backend"):
        AsyncTokenCharacterTrie.from_vocab(vocab, "gpu")
    row = np.random.default_rng(0).random(len(vocab))

    async def twice():
        first = await parallel.weight_sum(row)
        await parallel.cleanup()
        again = await parallel.weight_sum(row)
        parallel.shutdown()
        return first, again, await parallel.weight_max(row)

    first, again, maxes = asyncio.run(twice())
    np.testing.assert_array_equal(first, parallel.trie.weight_sum(row))
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(maxes, parallel.trie.weight_max(row))
    parallel.shutdown()


def test_torch_rows_give_the_masses_of_host_rows(monkeypatch):
    """Tensors are reduced where they live and give the host rows' masses: CPU tensors by
    core's C kernel (the same values, bit for bit), GPU tensors by core's torch kernel on
    their GPU (float64, equal to rounding)."""
    trie = ParallelTokenCharacterTrie([Token(i, b) for i, b in enumerate(VOCAB)] + ["do", End()])
    rows = np.random.default_rng(2).random((3, len(trie.decode)))
    on_torch = []
    real = trie.core._on_torch
    monkeypatch.setattr(trie.core, "_on_torch", lambda *a, **k: on_torch.append(a) or real(*a, **k))
    host_sum, host_max = trie.batch_weight_sum(rows), trie.batch_weight_max(rows)
    cpu = torch.tensor(rows, dtype=torch.float32)
    np.testing.assert_array_equal(
        trie.batch_weight_sum(cpu), trie.batch_weight_sum(rows.astype(np.float32))
    )
    np.testing.assert_array_equal(trie.weight_max(cpu[1]), trie.weight_max(cpu[1].numpy()))
    assert not on_torch
    # The device path (core's torch kernel, assembly on the rows' device), run on the CPU.
    as_tensor = torch.tensor(rows)
    for use_max, host in ((False, host_sum), (True, host_max)):
        reduce = trie.core.batch_weight_max if use_max else trie.core.batch_weight_sum
        got = trie._with_leaves(reduce(as_tensor), as_tensor, use_max)
        assert isinstance(got, np.ndarray) and got.dtype == np.float64
        np.testing.assert_allclose(got, host, rtol=1e-12, atol=0)
    if torch.cuda.is_available():
        on_torch.clear()
        gpu = torch.tensor(rows, device="cuda")
        got_sum, got_max = trie.batch_weight_sum(gpu), trie.weight_max(gpu[0])
        assert len(on_torch) == 2 and isinstance(got_sum, np.ndarray)
        np.testing.assert_allclose(got_sum, host_sum, rtol=1e-12, atol=0)
        np.testing.assert_array_equal(got_max, host_max[0])
    with pytest.raises(ValueError, match="batch"):
        trie.batch_weight_sum(rows[0])
