"""Tests for genlm.core._trie.TokenByteTrie against brute force over the token list."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.extension_copy import run_without_extension
from support.random_llama import tokenizer_dir

import genlm.core._trie as trie_module
from genlm.core import Vocabulary
from genlm.core._trie import EOS_EDGE, TokenByteTrie
from genlm.core.backend import check_real, compact_row

#: Both kernels where the C one was built (the numpy one is always there).
KERNELS = ["numpy"] if trie_module._trie_kernel is None else ["c", "numpy"]

# Small alphabets make shared prefixes, prefixes of each other and duplicates likely.
byte_strings = st.binary(min_size=0, max_size=5).map(lambda b: bytes(x % 4 for x in b))


@st.composite
def tries(draw, eos: bool | None = None, atomic: bool | None = None):
    """A random vocabulary, EOS and atomic ids, and the trie built from them.

    Each draw also picks the kernel and how many threads batched calls use, so
    every property below holds for both kernels, threaded or not.
    """
    vocab = draw(st.lists(byte_strings, min_size=1, max_size=40))
    ids = st.sampled_from(range(len(vocab)))
    use_eos = draw(st.booleans()) if eos is None else eos
    use_atomic = draw(st.booleans()) if atomic is None else atomic
    eos_ids = draw(st.lists(ids, min_size=1, max_size=3)) if use_eos else []
    atomic_ids = draw(st.lists(ids, max_size=4)) if use_atomic else []
    kernel = draw(st.sampled_from(KERNELS))
    threads = draw(st.sampled_from([1, 3]))
    # The numpy kernel's depth cut-off splits nodes between the level sweep and
    # the direct (node, token) pairs; small tries would always get all-pairs, so
    # force all-levels, a mix, and all-pairs.
    saved = trie_module._LEVEL_COST_IN_PAIRS
    trie_module._LEVEL_COST_IN_PAIRS = draw(st.sampled_from([0, 2, 10**9]))
    try:
        trie = TokenByteTrie(
            vocab, eos_token_ids=eos_ids, atomic_ids=atomic_ids, kernel=kernel, threads=threads
        )
    finally:
        trie_module._LEVEL_COST_IN_PAIRS = saved
    return trie, vocab


def contributing(trie: TokenByteTrie, vocab, prefix: bytes) -> list[int]:
    """Brute force: the ids whose weight a node with this byte prefix must receive."""
    eos = set(trie.eos_token_ids)
    return [
        i
        for i, b in enumerate(vocab)
        if i not in eos and i not in trie.atomic_ids and b and b.startswith(prefix)
    ]


def all_prefixes(trie: TokenByteTrie, vocab) -> set[bytes]:
    """Brute force: every byte prefix that should be a node (the root's b"" always)."""
    return {b""} | {
        b[:k] for b in (vocab[i] for i in contributing(trie, vocab, b"")) for k in range(len(b) + 1)
    }


def expected(trie: TokenByteTrie, vocab, node: int) -> list[int]:
    """Brute force: the ids below a node, the EOS node and root included."""
    eos = list(trie.eos_token_ids)
    if node == trie.eos_node:
        return eos
    ids = contributing(trie, vocab, trie.prefix(node))
    return ids + eos if node == trie.root else ids


def weights(n: int, seed: int, batch: int | None = None) -> np.ndarray:
    """Random positive weights spanning many orders of magnitude."""
    rng = np.random.default_rng(seed)
    shape = (n,) if batch is None else (batch, n)
    return np.exp(rng.uniform(-30, 0, size=shape))


class TestStructure:
    @given(tries())
    def test_nodes_are_the_prefixes(self, tv):
        """The byte nodes are exactly the prefixes of the contributing tokens."""
        trie, vocab = tv
        prefixes = [trie.prefix(v) for v in range(trie.num_nodes) if v != trie.eos_node]
        assert sorted(prefixes) == sorted(all_prefixes(trie, vocab))
        for v in range(trie.num_nodes):
            if v != trie.eos_node:
                assert trie.node_of(trie.prefix(v)) == v
                assert trie.depth[v] == len(trie.prefix(v))

    @given(tries())
    def test_children_and_parent_agree(self, tv):
        """children() lists each non-root node under its parent, by its edge label."""
        trie, _ = tv
        seen = {trie.root}
        for v in range(trie.num_nodes):
            for label, c in trie.children(v).items():
                assert trie.parent[c] == v and trie.edge[c] == label
                assert trie.child(v, label) == c
                seen.add(c)
        assert seen == set(range(trie.num_nodes))

    @given(tries())
    def test_tokens_at(self, tv):
        """tokens_at gives the ids whose bytes end exactly at the node (EOS ids at the EOS node)."""
        trie, vocab = tv
        for v in range(trie.num_nodes):
            if v == trie.eos_node:
                want = list(trie.eos_token_ids)
            else:
                p = trie.prefix(v)
                want = [i for i in contributing(trie, vocab, p) if vocab[i] == p]
            assert sorted(trie.tokens_at(v).tolist()) == sorted(want)

    @given(tries(eos=True))
    def test_eos_node_is_a_root_child(self, tv):
        """In EOS mode the EOS node hangs off the root under EOS_EDGE and has no byte prefix."""
        trie, _ = tv
        assert trie.eos_node is not None
        assert trie.children(trie.root)[EOS_EDGE] == trie.eos_node
        assert trie.children(trie.eos_node) == {}

    @given(tries(eos=False))
    def test_no_eos_node_without_eos_ids(self, tv):
        """Without EOS ids there is no EOS node and no EOS edge."""
        trie, _ = tv
        assert trie.eos_node is None
        assert EOS_EDGE not in trie.children(trie.root)

    def test_node_of_unknown_prefix(self):
        """node_of returns None for a prefix that no token starts with."""
        trie = TokenByteTrie([b"ab", b"ac"])
        assert trie.node_of(b"ad") is None and trie.node_of(b"abc") is None
        assert trie.node_of(b"") == trie.root

    @pytest.mark.parametrize(
        ("byte", "error"),
        [
            (257 + ord("b"), ValueError),  # key 355 is the root's key for b"b" one node on
            (-1, ValueError),  # key 257 * a - 1 is node a-1's EOS_EDGE child
            (-257 + ord("a"), ValueError),
            (ord("b") + 0.0, TypeError),
            (True, TypeError),
        ],
    )
    def test_child_refuses_edges_that_are_not_labels(self, byte, error):
        """child() refuses an edge outside 0..EOS_EDGE or not an integer: its lookup key
        node * 257 + byte named another node's child (child(a, -1) was the EOS node)."""
        trie = TokenByteTrie([b"ab", b"b", b"x"], eos_token_ids=[2])
        a = trie.child(trie.root, ord("a"))
        for node in (trie.root, a):
            with pytest.raises(error, match="edge label"):
                trie.child(node, byte)

    def test_child_takes_numpy_integers_and_every_label(self):
        """numpy integer nodes and edges are ids like Python ints; EOS_EDGE is a label."""
        trie = TokenByteTrie([b"ab", b"b", b"x"], eos_token_ids=[2])
        a = trie.child(trie.root, ord("a"))
        assert trie.prefix(trie.child(np.int64(a), np.uint8(ord("b")))) == b"ab"
        assert trie.child(trie.root, EOS_EDGE) == trie.eos_node
        assert trie.child(a, EOS_EDGE) is None and trie.child(a, 0) is None
        assert trie.child(a, 255) is None

    @pytest.mark.parametrize("method", ["children", "prefix", "tokens_at", "tokens_below"])
    def test_navigation_refuses_ids_that_are_not_nodes(self, method):
        """A node id outside 0..num_nodes-1 is a ValueError (numpy read -1 as the last node),
        a float or bool a TypeError; numpy integers are node ids."""
        trie = TokenByteTrie([b"ab", b"b"])
        call = getattr(trie, method)
        for node in (-1, -trie.num_nodes, trie.num_nodes):
            with pytest.raises(ValueError, match=f"node {node} is not a node"):
                call(node)
        for node in (1.0, True):
            with pytest.raises(TypeError, match="integer node id"):
                call(node)
        last = trie.num_nodes - 1
        assert np.array_equal(np.asarray(call(np.int64(last))), np.asarray(call(last)))
        with pytest.raises(ValueError, match="is not a node"):
            trie.child(-1, ord("a"))

    def test_rejects_out_of_range_ids(self):
        """EOS or atomic ids outside the vocabulary are rejected at build time."""
        with pytest.raises(ValueError, match="eos_token_ids"):
            TokenByteTrie([b"a"], eos_token_ids=[1])
        with pytest.raises(ValueError, match="atomic_ids"):
            TokenByteTrie([b"a"], atomic_ids=[-1])

    @pytest.mark.parametrize(
        ("entry", "message"),
        [
            (3, r"vocab\[1\] is int 3, not bytes"),  # bytes(3) is three zero bytes
            (None, r"vocab\[1\] is None, not bytes \(a hole is b''\)"),
            ("b", r"vocab\[1\] is str 'b', not bytes"),
            (2.0, r"vocab\[1\] is float 2.0, not bytes"),
        ],
    )
    def test_entries_that_are_not_bytes_are_rejected(self, entry, message):
        """A vocabulary entry that is not bytes is a TypeError naming its position (an int n
        became n zero bytes, None a hole, a str failed inside bytes())."""
        with pytest.raises(TypeError, match=message):
            TokenByteTrie([b"a", entry, b"c"])

    def test_bytes_subclasses_count_as_their_bytes(self):
        """A bytes subclass (as genlm-backend's Token) is accepted and spelled by its bytes."""

        class Tagged(bytes):
            pass

        trie = TokenByteTrie([Tagged(b"ab"), b"a"])
        assert (
            trie.node_of(b"ab") == trie.token_node[0] and trie.prefix(trie.token_node[0]) == b"ab"
        )

    @pytest.mark.parametrize("what", ["eos_token_ids", "atomic_ids"])
    @pytest.mark.parametrize("ids", [[1.7], [1.0], [True], 1, np.int64(1)])
    def test_ids_that_are_not_integers_are_rejected(self, what, ids):
        """EOS and atomic ids must be a collection of integers: 1.7 was truncated to 1."""
        with pytest.raises(TypeError, match=what):
            TokenByteTrie([b"a", b"b"], **{what: ids})

    def test_numpy_integer_ids_are_accepted(self):
        """numpy integer ids (and arrays of them) are ids like Python ints."""
        trie = TokenByteTrie(
            [b"a", b"b", b"c"], eos_token_ids=np.array([2]), atomic_ids=[np.int32(1)]
        )
        assert trie.eos_token_ids == (2,) and trie.atomic_ids == frozenset({1})


class TestWeights:
    @given(tries(), st.integers(0, 2**32 - 1))
    def test_sum_and_max_equal_brute_force(self, tv, seed):
        """Each node's sum and max equal those over the tokens starting with its prefix."""
        trie, vocab = tv
        w = weights(len(vocab), seed)
        s, m = trie.weight_sum(w), trie.weight_max(w)
        for v in range(trie.num_nodes):
            ids = expected(trie, vocab, v)
            assert s[v] == pytest.approx(w[ids].sum(), rel=1e-13, abs=0)
            assert m[v] == (w[ids].max() if ids else -np.inf)

    @given(tries(), st.integers(0, 2**32 - 1))
    def test_tokens_below_equal_brute_force(self, tv, seed):
        """tokens_below lists exactly the ids counted towards the node."""
        trie, vocab = tv
        for v in range(trie.num_nodes):
            assert sorted(trie.tokens_below(v).tolist()) == sorted(expected(trie, vocab, v))

    def test_atomic_and_empty_tokens_add_nowhere(self):
        """Atomic ids and empty byte strings contribute to no node, not even the root."""
        vocab = [b"a", b"", b"<s>", b"ab"]
        trie = TokenByteTrie(vocab, atomic_ids=[2])
        s = trie.weight_sum(np.array([1.0, 10.0, 100.0, 1000.0]))
        assert s[trie.root] == 1001.0
        assert trie.node_of(b"<") is None

    def test_eos_ids_leave_their_bytes(self):
        """EOS ids add to the EOS node and the root, not to the node of their literal bytes."""
        vocab = [b"a", b"ab", b"a"]
        trie = TokenByteTrie(vocab, eos_token_ids=[2])
        s = trie.weight_sum(np.array([1.0, 10.0, 100.0]))
        assert s[trie.eos_node] == 100.0
        assert s[trie.node_of(b"a")] == 11.0
        assert s[trie.root] == 111.0

    def test_duplicates_share_a_node(self):
        """Several ids with the same bytes all add to one node."""
        trie = TokenByteTrie([b"x", b"x", b"xy", b"x"])
        s = trie.weight_sum(np.array([1.0, 2.0, 4.0, 8.0]))
        assert s[trie.node_of(b"x")] == 15.0
        assert sorted(trie.tokens_at(trie.node_of(b"x")).tolist()) == [0, 1, 3]

    def test_small_mass_keeps_relative_precision(self):
        """A 1e-300 mass next to mass 1 is summed exactly, not lost to cancellation."""
        trie = TokenByteTrie([b"a", b"b", b"bc", b"c"])
        s = trie.weight_sum(np.array([0.5, 1e-300, 2e-300, 0.5]))
        assert s[trie.node_of(b"b")] == pytest.approx(3e-300, rel=1e-15)

    @given(tries(), st.integers(0, 2**32 - 1), st.integers(1, 3))
    def test_masked_rows_equal_brute_force(self, tv, seed, batch):
        """With masked (-inf / zero) tokens, batched maxes and sums equal brute force per node."""
        trie, vocab = tv
        rng = np.random.default_rng(seed)
        lp = np.log(weights(len(vocab), seed, batch))
        lp[rng.random(lp.shape) < 0.5] = -np.inf
        m, s = trie.batch_weight_max(lp), trie.batch_weight_sum(np.exp(lp))
        for b in range(batch):
            for v in range(trie.num_nodes):
                ids = expected(trie, vocab, v)
                assert m[b, v] == (lp[b, ids].max() if ids else -np.inf)
                assert s[b, v] == pytest.approx(np.exp(lp[b, ids]).sum(), rel=1e-13, abs=0)

    @given(tries(), st.integers(0, 2**32 - 1), st.integers(1, 4))
    def test_batched_equals_per_row(self, tv, seed, batch):
        """The batched forms equal the per-row forms row by row."""
        trie, vocab = tv
        W = weights(len(vocab), seed, batch)
        lp = np.log(W)
        for b, (s, m, ls, lm) in enumerate(
            zip(
                trie.batch_weight_sum(W),
                trie.batch_weight_max(W),
                trie.batch_log_weight_sum(lp),
                trie.batch_log_weight_max(lp),
            )
        ):
            np.testing.assert_array_equal(s, trie.weight_sum(W[b]))
            np.testing.assert_array_equal(m, trie.weight_max(W[b]))
            np.testing.assert_array_equal(ls, trie.log_weight_sum(lp[b]))
            np.testing.assert_array_equal(lm, trie.log_weight_max(lp[b]))

    @pytest.mark.parametrize("kernel", KERNELS)
    def test_empty_batch_gives_empty_rows(self, kernel):
        """A batch of zero rows returns a (0, num_nodes) array for every batched form."""
        trie = TokenByteTrie([b"a", b"ab"], kernel=kernel, threads=2)
        for method in (trie.batch_weight_sum, trie.batch_weight_max, trie.batch_log_weight_sum):
            assert method(np.ones((0, 2))).shape == (0, trie.num_nodes)

    @pytest.mark.parametrize("kernel", KERNELS)
    def test_empty_vocabulary_has_a_root_of_no_mass(self, kernel):
        """A trie of no tokens is its root alone: sum 0, max and log forms -inf, one row or
        a batch (the log sums failed with numpy's reshape error)."""
        trie = TokenByteTrie([], kernel=kernel)
        assert trie.num_nodes == 1 and trie.vocab_size == 0
        row, rows = np.zeros(0), np.zeros((2, 0))
        np.testing.assert_array_equal(trie.weight_sum(row), [0.0])
        np.testing.assert_array_equal(trie.batch_weight_sum(rows), [[0.0], [0.0]])
        for single, batched in (
            (trie.weight_max, trie.batch_weight_max),
            (trie.log_weight_max, trie.batch_log_weight_max),
            (trie.log_weight_sum, trie.batch_log_weight_sum),
        ):
            np.testing.assert_array_equal(single(row), [-np.inf])
            np.testing.assert_array_equal(batched(rows), [[-np.inf], [-np.inf]])

    @pytest.mark.parametrize(
        "method", ["weight_sum", "weight_max", "log_weight_sum", "batch_weight_sum"]
    )
    def test_complex_weights_are_refused(self, method):
        """Complex weights are a TypeError: the float64 cast dropped their imaginary parts
        with only a ComplexWarning."""
        trie = TokenByteTrie([b"a", b"b"])
        row = np.array([0.5, 0.5 + 1j])
        batched = method.startswith("batch")
        # An array, and the lists numpy makes one of (rows, or numbers).
        for weights in (row[None], [row]) if batched else (row, [0.5, 0.5 + 1j]):
            with pytest.raises(TypeError, match="weights must be real numbers, got complex128"):
                getattr(trie, method)(weights)

    @pytest.mark.parametrize(
        "weights", [["0.5", "0.5"], np.array(["0.5", "0.5"]), np.array([0.5, None], dtype=object)]
    )
    def test_strings_and_none_are_refused(self, weights):
        """numpy reads numeric strings as numbers and None as NaN: both are a TypeError."""
        trie = TokenByteTrie([b"a", b"b"])
        with pytest.raises(TypeError, match="weights must be an array of numbers, got"):
            trie.weight_sum(weights)

    def test_check_real_refuses_exactly_the_complex_dtypes(self):
        """The public check every reader of weights shares: an array is refused exactly when
        numpy calls its dtype complex; what is not an array yet (a list) is left to the
        check of the array made from it."""
        for code in np.typecodes["All"]:
            array = np.zeros(2, dtype=code)
            if np.issubdtype(array.dtype, np.complexfloating):
                with pytest.raises(TypeError, match=f"got {array.dtype} weights"):
                    check_real(array)
            else:
                check_real(array)
        check_real([0.5, 0.5 + 1j])

    def test_shape_is_checked(self):
        """Weights of the wrong shape are rejected with the expected shape in the message."""
        trie = TokenByteTrie([b"a", b"b"])
        with pytest.raises(ValueError, match=r"\(2,\)"):
            trie.weight_sum(np.ones(3))
        with pytest.raises(ValueError, match=r"\(B, 2\)"):
            trie.batch_weight_sum(np.ones(2))


class TestKernels:
    @pytest.mark.skipif(
        not os.environ.get("GENLM_REQUIRE_TRIE_KERNEL"),
        reason="GENLM_REQUIRE_TRIE_KERNEL unset (the nox sessions set it)",
    )
    def test_c_kernel_is_built_and_chosen(self):
        """Where genlm-core was installed with a C compiler, 'auto' picks the C kernel."""
        assert trie_module._trie_kernel is not None
        assert TokenByteTrie([b"a"]).kernel == "c"

    @pytest.mark.parametrize("built", [True, False])
    def test_first_trie_logs_the_kernel_auto_runs(self, built, monkeypatch, caplog):
        """The first trie of a process logs the kernel 'auto' runs: numpy where C is not built."""
        if built and trie_module._trie_kernel is None:
            pytest.skip("the C kernel is not built here")
        if not built:
            monkeypatch.setattr(trie_module, "_trie_kernel", None)
        trie_module._log_installed_kernel.cache_clear()
        with caplog.at_level("INFO", logger="genlm.core._trie"):
            first = TokenByteTrie([b"a"])
            TokenByteTrie([b"b"])
        [record] = caplog.records
        assert first.kernel == ("c" if built else "numpy")
        assert record.getMessage().startswith(
            f"token-byte trie: {'C' if built else 'numpy'} kernel"
        )

    @pytest.mark.parametrize("kernel_file", ["absent", "damaged"])
    def test_a_kernel_that_fails_to_load_is_reported_with_its_own_error(
        self, kernel_file, tmp_path
    ):
        """A copy of genlm.core whose C kernel is absent runs numpy and says it was not built;
        one whose kernel file is there but cannot load (here not a shared library; in the
        field a wheel built for a newer glibc) says so with the loader's own error, in the
        log (a warning) and in kernel='c''s error, instead of blaming a missing compiler."""
        script = """
from genlm.core._trie import TokenByteTrie
assert TokenByteTrie([b"a"]).kernel == "numpy"
try:
    TokenByteTrie([b"a"], kernel="c")
except RuntimeError as exc:
    print("ERROR", exc)
"""
        lines, log = run_without_extension(tmp_path, "_trie_kernel", kernel_file, script)
        if kernel_file == "absent":
            assert "No module named 'genlm.core._trie_kernel'" in lines["CAUSE"]
            assert "C kernel was not built (no C compiler" in lines["ERROR"]
            assert "INFO token-byte trie: numpy kernel" in log and "was not built" in log
        else:
            cause = lines["CAUSE"]
            assert cause and "No module named" not in cause
            assert "failed to load" in lines["ERROR"] and cause in lines["ERROR"]
            assert "not built" not in lines["ERROR"] + log
            assert "WARNING token-byte trie: numpy kernel" in log and cause in log

    @pytest.mark.parametrize("kernel", KERNELS)
    @pytest.mark.parametrize("threads", [1, 2])
    @pytest.mark.filterwarnings("error::RuntimeWarning")
    def test_nan_propagates_to_ancestors_only(self, kernel, threads):
        """A NaN weight makes its node's and its ancestors' sums and maxes NaN, as np.maximum,
        and so does a sum of +inf and -inf; silently in every kernel (numpy's warned, which
        failed the call under warnings as errors)."""
        trie = TokenByteTrie([b"a", b"ab", b"abc", b"b"], kernel=kernel, threads=threads)
        w = np.array([[0.1, np.nan, 0.2, 0.3], [0.1, 0.4, 0.2, 0.3]])
        for out in (trie.batch_weight_sum(w), trie.batch_weight_max(w)):
            nan = {trie.prefix(v) for v in np.flatnonzero(np.isnan(out[0]))}
            assert nan == {b"", b"a", b"ab"}
            assert not np.isnan(out[1]).any()
        out = trie.weight_sum(np.array([0.1, np.inf, -np.inf, 0.3]))
        assert {trie.prefix(v) for v in np.flatnonzero(np.isnan(out))} == {b"", b"a", b"ab"}
        assert trie.batch_weight_max(w)[0, trie.node_of(b"b")] == 0.3

    @given(tries(), st.integers(0, 2**32 - 1))
    def test_kernels_agree(self, tv, seed):
        """The C and numpy kernels give equal maxes and sums equal to the last bits."""
        trie, vocab = tv
        other = TokenByteTrie(vocab, trie.eos_token_ids, trie.atomic_ids, kernel="numpy")
        W = weights(len(vocab), seed, 3)
        np.testing.assert_array_equal(trie.batch_weight_max(W), other.batch_weight_max(W))
        np.testing.assert_allclose(trie.batch_weight_sum(W), other.batch_weight_sum(W), rtol=1e-14)

    @pytest.mark.parametrize("threads", [1.5, 2.0, True, "2"])
    def test_threads_must_be_an_integer(self, threads):
        """threads that is not an integer fails at construction, by name (1.5 failed at the
        first batched call, inside range(); True was one thread)."""
        with pytest.raises(TypeError, match="threads must be an integer"):
            TokenByteTrie([b"a"], threads=threads)

    def test_numpy_integer_threads_are_accepted(self):
        """A numpy integer is a thread count like a Python int."""
        trie = TokenByteTrie([b"a", b"b"], threads=np.int64(2))
        assert trie.threads == 2 and type(trie.threads) is int
        np.testing.assert_array_equal(trie.batch_weight_sum(np.ones((3, 2)))[:, trie.root], 2.0)

    def test_bad_kernel_and_threads_are_rejected(self, monkeypatch):
        """An unknown kernel, threads < 1, or 'c' where it was not built fail with clear errors."""
        with pytest.raises(ValueError, match="kernel must be"):
            TokenByteTrie([b"a"], kernel="fortran")
        with pytest.raises(ValueError, match="threads must be >= 1"):
            TokenByteTrie([b"a"], threads=0)
        monkeypatch.setattr(trie_module, "_trie_kernel", None)
        with pytest.raises(RuntimeError, match="C kernel was not built"):
            TokenByteTrie([b"a"], kernel="c")
        assert TokenByteTrie([b"a"]).kernel == "numpy"


needs_c_module = pytest.mark.skipif(
    trie_module._trie_kernel is None, reason="the C module (and its output pool) was not built"
)


@pytest.fixture
def empty_pool():
    """The output pool emptied, with room for 1 GiB; its old limit restored afterwards."""
    previous = trie_module.set_trie_pool_limit(0)
    trie_module.set_trie_pool_limit(1 << 30)
    yield trie_module._trie_kernel
    trie_module.set_trie_pool_limit(previous)


#: Rows of a 4-node trie's output that make 1 MiB, the smallest pooled size.
BIG_ROWS = 2**20 // (4 * 8)


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class TestOutputPool:
    @given(tries(), st.integers(0, 2**32 - 1))
    def test_outputs_in_use_are_never_overwritten(self, tv, seed):
        """Outputs (and views of them) that are still referenced keep their values while
        later calls, whose outputs are dropped or kept, run in between."""
        trie, vocab = tv
        other = TokenByteTrie(vocab, trie.eos_token_ids, trie.atomic_ids, kernel="numpy")
        W = [weights(len(vocab), seed + i, 2) for i in range(6)]
        expect = [other.batch_weight_sum(w).copy() for w in W]
        row = trie.batch_weight_sum(W[0])[1]  # a view; its base array is dropped
        kept = []
        for i, w in enumerate(W[1:], 1):
            trie.batch_weight_sum(w)  # dropped at once: its memory may be reused
            kept.append((i, trie.batch_weight_sum(w)))
            trie.weight_sum(w[0])
        np.testing.assert_allclose(row, expect[0][1], rtol=1e-14)
        for i, out in kept:
            np.testing.assert_allclose(out, expect[i], rtol=1e-14)
        assert len({address(out) for _, out in kept} | {address(row)}) == len(kept) + 1

    @needs_c_module
    def test_freed_output_is_reused(self, empty_pool):
        """A dropped output of 1 MiB or more goes to the pool and the next output of 1 to 2
        times its size takes its memory; a smaller one does not."""
        trie = TokenByteTrie([b"a", b"ab", b"b"], threads=1)  # no worker holds a view
        W = weights(3, 0, BIG_ROWS * 3)
        out = trie.batch_weight_sum(W)  # 3 MiB
        where, nbytes = address(out), out.nbytes
        del out
        assert empty_pool.pool_stats() == (1, nbytes)
        small = trie.batch_weight_sum(W[:BIG_ROWS])  # 1 MiB: under half the block
        assert address(small) != where and empty_pool.pool_stats() == (1, nbytes)
        again = trie.batch_weight_max(W[: BIG_ROWS * 2])  # 2 MiB: fits
        assert address(again) == where and empty_pool.pool_stats() == (0, 0)
        np.testing.assert_array_equal(again[:, trie.node_of(b"a")], W[: BIG_ROWS * 2, :2].max(1))

    @needs_c_module
    def test_compact_row_copies_an_output_only_out_of_a_larger_block(self, empty_pool):
        """``compact_row`` keeps an output whose block is exactly its size and copies one
        in a larger pooled block, or a row of a batch: a cache that counts ``nbytes`` of
        what it keeps then counts the memory held."""
        trie = TokenByteTrie([b"a", b"ab", b"b"], threads=1)
        W = weights(3, 0, BIG_ROWS)
        exact = trie.batch_weight_sum(W)  # 1 MiB, a new block
        nbytes = exact.nbytes
        assert compact_row(exact) is exact
        assert compact_row(exact[0]) is not exact[0]  # one row of the batch's block
        empty_pool.empty(nbytes * 3 // 2)  # freed at once: a block half again as large
        reused = trie.batch_weight_sum(W)  # in that block (``exact`` holds its own)
        kept = compact_row(reused)
        assert kept is not reused and kept.base is None
        np.testing.assert_array_equal(kept, reused)

    @needs_c_module
    def test_small_outputs_are_not_pooled(self, empty_pool):
        """Outputs under 1 MiB go straight back to malloc, so they never evict big blocks."""
        trie = TokenByteTrie([b"a", b"ab", b"b"], threads=1)
        trie.batch_weight_sum(weights(3, 0, BIG_ROWS))
        held = empty_pool.pool_stats()
        assert held[0] == 1
        for i in range(10):
            trie.weight_sum(weights(3, i))
            trie.batch_weight_sum(weights(3, i, 100))
        assert empty_pool.pool_stats() == held

    @needs_c_module
    def test_pool_keeps_at_most_eight_blocks_and_its_limit(self, empty_pool):
        """At most 8 freed blocks stay pooled, never more bytes than the limit, and
        a limit of 0 sends every freed output back to the OS."""
        trie = TokenByteTrie([b"a", b"ab", b"b"], threads=1)
        outs = [trie.batch_weight_sum(weights(3, i, BIG_ROWS + 1000 * i)) for i in range(12)]
        sizes = [o.nbytes for o in outs]
        for i in range(12):
            outs[i] = None  # freed in order
        assert empty_pool.pool_stats() == (8, sum(sizes[4:]))  # the 8 freed last
        assert trie_module.set_trie_pool_limit(sizes[-1] + sizes[-2]) == 1 << 30
        assert empty_pool.pool_stats() == (2, sizes[-1] + sizes[-2])
        trie_module.set_trie_pool_limit(0)
        assert empty_pool.pool_stats() == (0, 0)
        trie.batch_weight_sum(weights(3, 0, BIG_ROWS))  # dropped at once
        assert empty_pool.pool_stats() == (0, 0)

    def test_negative_limit_is_rejected(self):
        with pytest.raises(ValueError, match=r"pool limit \(nbytes\) must be >= 0"):
            trie_module.set_trie_pool_limit(-1)

    @pytest.mark.parametrize("bad", [2.5, True, "1", None, float("nan"), float("inf")])
    def test_a_limit_that_is_not_a_whole_number_is_a_type_error(self, bad):
        """2.5 and True were truncated to 2 and 1 silently, NaN and inf failed converting,
        a string in a comparison: each is a TypeError naming the limit."""
        with pytest.raises(TypeError, match=r"pool limit \(nbytes\) must be an integer"):
            trie_module.set_trie_pool_limit(bad)

    def test_a_limit_past_the_c_range_is_a_value_error(self):
        """2**70 failed converting to a C ssize_t (an OverflowError)."""
        with pytest.raises(ValueError, match=r"at most sys\.maxsize, got 1180591620717411303424"):
            trie_module.set_trie_pool_limit(2**70)

    def test_a_whole_float_limit_is_its_integer(self):
        """1e9 bytes is 10**9 (the limit a later call returns, where the C module is built)."""
        previous = trie_module.set_trie_pool_limit(1e9)
        try:
            expected = 0 if trie_module._trie_kernel is None else 10**9  # 0: no pool
            assert trie_module.set_trie_pool_limit(previous) == expected
        finally:
            trie_module.set_trie_pool_limit(previous)


class TestLogSpace:
    @given(tries(), st.integers(0, 2**32 - 1))
    @settings(deadline=None)
    def test_log_sum_equals_log_of_float64_sum(self, tv, seed):
        """log_weight_sum equals the log of the float64 brute-force sum; log_weight_max the max."""
        trie, vocab = tv
        lp = np.log(weights(len(vocab), seed))
        ls, lm = trie.log_weight_sum(lp), trie.log_weight_max(lp)
        for v in range(trie.num_nodes):
            ids = expected(trie, vocab, v)
            want = np.log(np.exp(lp[ids]).sum()) if ids else -np.inf
            assert ls[v] == pytest.approx(want, rel=1e-12, abs=1e-12)
            assert lm[v] == (lp[ids].max() if ids else -np.inf)

    def test_mass_1e300_is_finite_and_correct(self):
        """A prefix of mass 1e-300 (logprob about -690.8) gets its exact finite log-mass."""
        trie = TokenByteTrie([b"a", b"bc", b"bd"])
        lp = np.array([0.0, np.log(4e-301), np.log(6e-301)])
        ls = trie.log_weight_sum(lp)
        assert ls[trie.node_of(b"b")] == pytest.approx(np.log(1e-300), rel=1e-14)
        assert ls[trie.node_of(b"bc")] == pytest.approx(np.log(4e-301), rel=1e-14)

    def test_masses_below_float64_range(self):
        """Log-masses far below float64's range (-800, -5000 nats) come out exact, not -inf."""
        trie = TokenByteTrie([b"a", b"bc", b"bd", b"e"])
        lp = np.array([0.0, -800.0, -800.0, -5000.0])
        ls = trie.log_weight_sum(lp)
        assert ls[trie.node_of(b"b")] == pytest.approx(-800.0 + np.log(2.0), rel=1e-15)
        assert ls[trie.node_of(b"e")] == -5000.0
        assert ls[trie.root] == pytest.approx(0.0, abs=1e-300)

    def test_all_minus_inf_node_is_minus_inf(self):
        """A node whose tokens are all -inf gets -inf; its siblings are unaffected."""
        trie = TokenByteTrie([b"a", b"ab", b"c"])
        lp = np.array([-np.inf, -np.inf, np.log(0.25)])
        ls = trie.log_weight_sum(lp)
        assert ls[trie.node_of(b"a")] == -np.inf and ls[trie.node_of(b"ab")] == -np.inf
        assert ls[trie.node_of(b"c")] == pytest.approx(np.log(0.25))
        assert np.all(trie.log_weight_sum(np.full(3, -np.inf)) == -np.inf)


def brute_log_sum(values: np.ndarray) -> float:
    """Brute force: a node's log-mass from its tokens' logprobs, under the documented rule
    for non-finite ones (NaN wins, then +inf; -inf tokens weigh nothing)."""
    if np.isnan(values).any():
        return np.nan
    if np.isposinf(values).any():
        return np.inf
    values = values[np.isfinite(values)]
    if not len(values):
        return -np.inf
    top = values.max()
    return top + np.log(np.exp(values - top).sum())


#: Logprobs 1600 nats apart, and the three non-finite values.
wide_logprobs = st.one_of(
    st.floats(-800, 800), st.sampled_from([np.nan, np.inf, -np.inf]), st.just(0.0)
)


class TestNonFiniteLogSums:
    @given(tries(), st.data())
    @settings(deadline=None)
    @pytest.mark.filterwarnings("ignore:invalid value encountered")
    def test_only_the_nodes_above_a_nan_or_inf_change(self, tv, data):
        """With NaN and +inf in a row, the nodes above them are NaN (or +inf), and every
        other node keeps its exact log-mass, in both kernels, batched or not (a NaN or +inf
        anywhere used to cancel the row's shift: 800 became +inf, -800 -inf)."""
        trie, vocab = tv
        rows = np.array(
            [
                data.draw(st.lists(wide_logprobs, min_size=len(vocab), max_size=len(vocab)))
                for _ in range(2)
            ]
        )
        want = [[brute_log_sum(row[expected(trie, vocab, v)]) for v in range(trie.num_nodes)]
                for row in rows]  # fmt: skip
        for got in (trie.batch_log_weight_sum(rows), [trie.log_weight_sum(r) for r in rows]):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)  # NaN where NaN

    @pytest.mark.parametrize("kernel", KERNELS)
    @pytest.mark.parametrize("bad", [np.nan, np.inf])
    def test_nan_or_inf_leaves_far_masses_exact(self, kernel, bad):
        """One NaN or +inf token beside tokens at +800 and -800 nats: only its own node and
        the root take its value; the others are 800 and -800 exactly."""
        trie = TokenByteTrie([b"a", b"b", b"c", b"cd"], kernel=kernel)
        ls = trie.log_weight_sum(np.array([bad, 800.0, -800.0, -800.0]))
        assert ls[trie.node_of(b"b")] == 800.0
        assert ls[trie.node_of(b"c")] == pytest.approx(-800.0 + np.log(2.0), rel=1e-15)
        assert ls[trie.node_of(b"cd")] == -800.0
        np.testing.assert_array_equal(ls[[trie.root, trie.node_of(b"a")]], [bad, bad])


@pytest.fixture(scope="module")
def gpt2_vocab() -> list[bytes]:
    """The byte strings of the real GPT-2 vocabulary (50,257 tokens), read by genlm-core."""
    path = tokenizer_dir("gpt2")  # the committed fixture: this never skips
    return list(Vocabulary.from_tokenizer_json(path).tokens)


def test_gpt2_random_nodes_equal_brute_force(gpt2_vocab):
    """On the real GPT-2 vocabulary, random nodes' sums, maxes and log-sums match brute force."""
    trie = TokenByteTrie(gpt2_vocab, eos_token_ids=[50256])
    rng = np.random.default_rng(0)
    lp = np.log(rng.dirichlet(np.full(len(gpt2_vocab), 0.1)))
    w = np.exp(lp)
    s, m, ls = trie.weight_sum(w), trie.weight_max(w), trie.log_weight_sum(lp)
    assert s[trie.root] == pytest.approx(w.sum(), rel=1e-12)
    for v in rng.integers(0, trie.num_nodes, 300):
        p = trie.prefix(v)
        if v == trie.eos_node:
            ids = [50256]
        else:
            ids = [i for i, b in enumerate(gpt2_vocab) if i != 50256 and b.startswith(p)]
        assert sorted(trie.tokens_below(v).tolist()) == sorted(ids)
        assert s[v] == pytest.approx(w[ids].sum(), rel=1e-12)
        assert m[v] == w[ids].max()
        assert ls[v] == pytest.approx(np.log(w[ids].sum()), rel=1e-12)
    assert trie.node_of(b" Hello") is not None
