"""The token-byte trie: prefix masses of a token distribution, per byte prefix.

A byte-level LM over a token LM asks, for every byte prefix ``p``, how much
probability the token LM puts on tokens whose bytes start with ``p`` (the
*weight sum* of the trie node for ``p``) and how large the largest such token
is (the *weight max*). This module builds that trie once per vocabulary and
answers both questions for whole distributions with one compiled pass over the
nodes (or, without a C compiler, a handful of vectorised numpy operations).

Layout (why it is fast)
-----------------------
Nodes are numbered breadth-first: the root is 0, then every depth-1 node in
byte order, then every depth-2 node, and so on. Within a depth the order is the
depth-first preorder of the trie, so

* every child has a larger id than its parent,
* the children of a node are one contiguous id range, and
* the parents of one depth's nodes form a non-decreasing sequence.

Kernels
-------
Sums and maxes run the same kernel with ``+`` or ``max``. There are two
implementations; both add each node's own tokens and its children's sums, in
different orders, so their sums may differ in the last bits (maxes never do):

* ``"c"`` (``_trie_kernel.c``, built at install time where a C compiler is
  available): per row, every node starts from the identity, each token is
  folded into its node, then one loop from the last node down to 1 folds
  ``out[parent[v]]`` with ``out[v]``; breadth-first ids guarantee that each node
  is complete before it is folded into its parent. About 0.5 ms a row on
  llama3.2's 274,522 nodes, with the GIL released.
* ``"numpy"`` (the fallback): the nodes start from one gather of their first
  own token's weight (``np.take``), then the levels are folded bottom-up, each
  with one unbuffered ``np.add.at`` (or ``np.maximum.at``) of a contiguous
  slice into the contiguous slice of the depth above, with sorted indices.
  (This beat ``np.bincount`` + add for sums and ``reduceat`` over sibling
  families for maxes: ``reduceat`` pays ~25 ns per segment, and most families
  have one or two children.) Long tokens make the trie deep (128 levels for
  gpt2 and llama3.2) while the deep levels hold few nodes, so nodes deeper than
  a cut-off (chosen at build time from a cost model) are computed directly:
  every (deep node, token below it) pair is listed once, sorted by node, and
  one ``reduceat`` over the gathered token weights gives all of them at once.

Batched calls split their rows over threads (:attr:`TokenByteTrie.threads`);
both kernels release the GIL for the bulk of their work.

Non-finite values: a NaN makes its node and every ancestor NaN (sums, maxes and log
sums); else a +inf makes them +inf (a weight sum that also meets a -inf weight is NaN,
as float addition gives); a ``-inf`` log-probability is a token of probability zero.
Every other node keeps its exact value: log sums shift each row by its largest *finite*
value, so a NaN or +inf in a row changes no node it is not below. Both kernels, and
the torch kernel's log sums, give the same non-finite values.

Output memory
-------------
Where the C module is built, outputs live in its blocks (``_trie_kernel.empty``):
when the last array that views an output is freed, its memory goes to a small
pool (:func:`set_trie_pool_limit`, 256 MiB by default; outputs of 1 MiB or more,
since malloc already recycles smaller ones) and the next output of a fitting size
reuses it. A reused block may be up to twice the output's size. A 32-row
llama3.2 output is 67 MiB; glibc maps every allocation above 32 MiB afresh and
unmaps it on free, so without the pool each call paid for zeroing and faulting in
every page again (15 ms a call instead of 9). A block is reused only once
nothing references it, so outputs a caller keeps are never overwritten. A caller
that keeps outputs and counts their bytes (genlm-bytes' mass cache) keeps
``genlm.core.backend.compact_row(output)``: the output itself, or a copy where its
block is larger than it.

Torch rows
----------
Every method also takes torch tensors, on any device: they are reduced there
(``_trie_torch``, float64, one gather and one scatter over (node, token) pairs)
and the result is a float64 tensor on the same device. torch is imported only
when a caller hands the trie a tensor; ``genlm.core`` itself never imports it.

Every sum is a sum of the node's own tokens' weights and its children's sums,
so no difference of large numbers is ever taken: a node's sum has relative
error ``O(depth * eps)`` whatever the sizes of the other masses. (A prefix-sum
difference ``cumsum[end] - cumsum[start]`` would be faster by a small factor
but loses everything below ``eps * total`` to cancellation; the byte-level LM
divides small masses by each other, so that trade is not worth it.)

Log space
---------
``log_weight_sum`` shifts by the row max (of the finite values; see "Kernels"
for NaN and +inf), exponentiates in float64, sums as above and takes the log. A
node whose shifted mass falls below ``2**-960`` (about ``1e-289``, i.e. its
log-mass is more than ~665 nats below the row max) may have lost precision to
underflow, so exactly those nodes are recomputed with a per-node shift (the
node's own max), from the list of tokens below them. The result is exact for
any finite logprobs, e.g. a node with mass ``1e-300`` or with log-mass
``-800``, and ``-inf`` for nodes whose tokens are all ``-inf``.

Special tokens
--------------
* ``atomic_ids`` (special tokens such as ``<|begin_of_text|>``) are not spelled
  by bytes, so they add to no byte node and not to the root.
* ``eos_token_ids`` add to a virtual EOS node, a child of the root reached by
  the edge label :data:`EOS_EDGE` (256, one past the last byte), instead of to
  their literal bytes. The root's sum therefore includes the EOS mass.
* Empty byte strings (holes in a vocabulary) add nowhere.
* Several ids with the same bytes all add to the same node.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Literal

import numpy as np

from genlm.core._extensions import load_extension, unavailable
from genlm.core._rows import check_real as _check_real
from genlm.core._rows import is_torch as _is_torch
from genlm.core._validation import check_token_bytes, checked_count, is_integer

_KERNEL = "genlm.core._trie_kernel"

#: The numpy kernel does the work where this is None; ``_kernel_error`` then says whether
#: the C one was not built (None) or failed to load (its error).
_trie_kernel, _kernel_error = load_extension(_KERNEL)

__all__ = ["EOS_EDGE", "TokenByteTrie", "set_trie_pool_limit"]

logger = logging.getLogger(__name__)

EOS_EDGE = 256
"""Edge label of the root's EOS child in :meth:`TokenByteTrie.children`; one past
the largest byte so that it sorts after every byte edge."""

# A shifted node mass below this may have lost bits to float64 underflow
# (terms below ~2.2e-308 become subnormal or zero); such nodes are recomputed
# exactly with their own shift. With at most ~1e6 tokens, the flushed terms are
# worth at most ~5e-318 in total, i.e. < 1e-28 relative to any mass above it.
_TINY = 2.0**-960

# Cost model used to choose the depth cut-off, in units of one gathered and
# reduced (node, token) pair: sweeping one level costs about this many pairs
# (numpy call overhead of a few microseconds).
_LEVEL_COST_IN_PAIRS = 2500


class TokenByteTrie:
    """Trie of the byte strings of a token vocabulary, with vectorised prefix masses.

    Args:
        vocab: ``vocab[i]`` is the byte string of token id ``i``. Empty strings
            (holes) are allowed and contribute nowhere. An empty vocabulary makes a
            trie of the root alone (sum 0; max and log sum -inf). Entries must be
            ``bytes`` (a subclass, such as genlm-backend's ``Token``, counts as its bytes).
        eos_token_ids: ids whose weight goes to the virtual EOS child of the
            root instead of to their bytes. Giving any enables EOS mode
            (:attr:`eos_node` is not None).
        atomic_ids: ids that are not spelled by bytes (special tokens); their
            weight goes nowhere unless they are also EOS ids.
        kernel: ``"c"`` (the compiled kernel, ``_trie_kernel.c``), ``"numpy"``
            (the vectorised level sweep), or ``"auto"``: C where it was built
            at install time, else numpy. Both compute the same masses (sums
            may differ in the last bits: the terms are added in other orders).
        threads: how many threads a batched call splits its rows over (None:
            one per CPU this process may use). Single rows use one thread.

    Raises:
        TypeError: an entry of ``vocab`` is not bytes (``None`` included: a hole is
            ``b""``), an EOS or atomic id is not an integer (a float, a bool), or
            ``eos_token_ids``/``atomic_ids`` is a bare id instead of a collection;
            ``threads`` is not an integer (a float, a bool, a string).
        ValueError: an EOS or atomic id is outside the vocabulary; an unknown
            ``kernel``, or ``threads`` below 1.

    Attributes:
        root: the root node id (always 0).
        eos_node: the virtual EOS node's id, or None without EOS ids.
        num_nodes: number of nodes, root and EOS node included.
        vocab_size: ``len(vocab)``; weight vectors must have this length.
        depth: ``depth[v]`` is the number of bytes of node ``v``'s prefix (the
            EOS node has depth 1).
        parent: ``parent[v]`` is the parent id (-1 for the root).
        edge: ``edge[v]`` is the byte labelling the edge into ``v``
            (:data:`EOS_EDGE` for the EOS node, -1 for the root).
        child_start, child_stop: the children of ``v`` are the ids
            ``range(child_start[v], child_stop[v])``, in increasing edge order.
        token_node: ``token_node[i]`` is the node token ``i`` adds to, or -1.
        kernel: the kernel in use, ``"c"`` or ``"numpy"``.
        threads: the most threads a batched call uses.

    The mass methods take one row of ``vocab_size`` token weights (or log-probabilities)
    and return a float64 array of one value per node, indexed by node id; their
    ``batch_`` twins take ``(B, vocab_size)``, split the rows over :attr:`threads`
    threads and return ``(B, num_nodes)`` (rows may be views of one pooled output block).
    A row of another shape raises ``ValueError``, complex weights ``TypeError`` (a cast would
    drop their imaginary parts). Each also takes a torch tensor, on any
    device, and then returns a float64 tensor on that device, computed there
    (``_trie_torch``; torch is imported only then).

    The navigation methods (:meth:`children`, :meth:`child`, :meth:`prefix`,
    :meth:`tokens_at`, :meth:`tokens_below`) take a node id ``0 .. num_nodes - 1`` (a
    Python or numpy integer): another id is a ``ValueError`` (numpy would read ``-1`` as
    the last node), a float or bool a ``TypeError``.
    """

    root: int = 0

    def __init__(
        self,
        vocab: Sequence[bytes],
        eos_token_ids: Sequence[int] = (),
        atomic_ids: Iterable[int] = (),
        kernel: Literal["auto", "c", "numpy"] = "auto",
        threads: int | None = None,
    ) -> None:
        if kernel not in ("auto", "c", "numpy"):
            raise ValueError(f"kernel must be 'auto', 'c' or 'numpy', got {kernel!r}")
        if kernel == "c" and _trie_kernel is None:
            raise RuntimeError(
                f"{_kernel_unavailable()}; reinstall genlm-core built here with a C compiler "
                "(pip install --force-reinstall --no-deps --no-binary genlm-core genlm-core), "
                "or use kernel='numpy'"
            ) from _kernel_error
        self.kernel = "numpy" if kernel == "numpy" or _trie_kernel is None else "c"
        _log_installed_kernel()
        # Checked here, not at the first batched call (where 1.5 failed inside range()).
        self.threads = _usable_cpus() if threads is None else checked_count("threads", threads, 1)
        V = len(vocab)
        check_token_bytes(vocab)
        eos = sorted(
            {_check_id(i, V, "eos_token_ids") for i in _ids(eos_token_ids, "eos_token_ids")}
        )
        eos_set = set(eos)
        atomic = {_check_id(i, V, "atomic_ids") for i in _ids(atomic_ids, "atomic_ids")} - eos_set
        self.vocab_size = V
        self.eos_token_ids: tuple[int, ...] = tuple(eos)
        self.atomic_ids: frozenset[int] = frozenset(atomic)

        # Ids spelled by bytes, and their byte strings sorted lexicographically:
        # the distinct prefixes of sorted strings, in order of first appearance,
        # are the trie's nodes in depth-first preorder.
        skip = eos_set | atomic
        byte_ids = [i for i in range(V) if i not in skip and vocab[i]]
        strings = sorted({bytes(vocab[i]) for i in byte_ids})
        n = len(strings)
        index = {s: k for k, s in enumerate(strings)}
        lens = np.fromiter(map(len, strings), dtype=np.int64, count=n)
        offs = np.zeros(n, dtype=np.int64)
        np.cumsum(lens[:-1], out=offs[1:])
        flat = np.frombuffer(b"".join(strings), dtype=np.uint8)
        lcp = _adjacent_lcp(flat, offs, lens)

        # String k creates the nodes for its prefixes of length lcp[k]+1..len[k]
        # (at least one: sorted distinct strings never repeat a predecessor).
        new = lens - lcp
        total = int(new.sum())
        first = np.zeros(n, dtype=np.int64)
        np.cumsum(new[:-1], out=first[1:])
        owner = np.repeat(np.arange(n), new)
        pdepth = lcp[owner] + 1 + (np.arange(total) - first[owner])
        pedge = flat[offs[owner] + pdepth - 1].astype(np.int16)
        # Preorder ids: root 0, byte nodes 1..total, then the EOS node.
        string_pre = first + new  # preorder id of the node of string k
        pdepth = np.concatenate([[0], pdepth, [1] if eos else []]).astype(np.int64)
        pedge = np.concatenate([[-1], pedge, [EOS_EDGE] if eos else []]).astype(np.int16)
        N = len(pdepth)

        # Breadth-first ids: stable sort of preorder ids by depth.
        order = np.argsort(pdepth, kind="stable")  # bfs id -> preorder id
        bfs_of_pre = np.empty(N, dtype=np.int64)
        bfs_of_pre[order] = np.arange(N)
        depth = pdepth[order]
        counts = np.bincount(depth)
        level = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=level[1:])  # nodes of depth d: level[d]:level[d+1]
        # The parent of a node is the last node one level up that precedes it
        # in preorder.
        parent = np.full(N, -1, dtype=np.int64)
        for d in range(1, len(counts)):
            up = order[level[d - 1] : level[d]]
            here = order[level[d] : level[d + 1]]
            parent[level[d] : level[d + 1]] = level[d - 1] + np.searchsorted(up, here) - 1

        self.num_nodes = N
        self.depth = depth
        self.parent = parent
        self.edge = pedge[order]
        self.eos_node: int | None = int(bfs_of_pre[N - 1]) if eos else None
        family = np.flatnonzero(np.diff(parent, prepend=-2, append=-2))  # family bounds
        self.child_start = np.zeros(N, dtype=np.int64)
        self.child_stop = np.zeros(N, dtype=np.int64)
        self.child_start[parent[family[1:-1]]] = family[1:-1]
        self.child_stop[parent[family[1:-1]]] = family[2:]
        self._level = level

        token_node = np.full(V, -1, dtype=np.int64)
        if byte_ids:
            ks = np.fromiter((index[bytes(vocab[i])] for i in byte_ids), np.int64, len(byte_ids))
            token_node[byte_ids] = bfs_of_pre[string_pre[ks]]
        if eos:
            token_node[eos] = self.eos_node
        self.token_node = token_node
        tok = np.flatnonzero(token_node >= 0)
        tok = tok[np.argsort(token_node[tok], kind="stable")]
        self._tokens_by_node = tok
        self._tokens_ptr = np.searchsorted(token_node[tok], np.arange(N + 1))

        # Subtree sizes (bottom-up), then each node's range of tokens in a
        # token list sorted by preorder: used by the exact log-space fallback.
        size = np.ones(N, dtype=np.int64)
        for d in range(len(counts) - 1, 0, -1):
            lo, hi = level[d], level[d + 1]
            size[: level[d]] += np.bincount(parent[lo:hi], size[lo:hi], level[d]).astype(np.int64)
        pre = order  # preorder id of each bfs id
        tok_pre = pre[token_node[tok]]
        perm = np.argsort(tok_pre, kind="stable")
        self._pre_tokens = tok[perm]
        tok_pre = tok_pre[perm]
        self._sub_lo = np.searchsorted(tok_pre, pre, "left")
        self._sub_hi = np.searchsorted(tok_pre, pre + size, "left")
        if self.kernel == "c":
            # Ids below 2**31, as in any trie that fits in memory.
            self._c_tok = tok.astype(np.int32)
            self._c_tnode = token_node[tok].astype(np.int32)
            self._c_parent = parent.astype(np.int32)
        else:
            self._plan(tok, token_node[tok], depth, level, parent)

    def _plan(
        self,
        tok: np.ndarray,
        tnode: np.ndarray,
        depth: np.ndarray,
        level: np.ndarray,
        parent: np.ndarray,
    ) -> None:
        """Precompute the index arrays of the numpy kernel (see module docstring)."""
        max_depth = len(level) - 2
        tdepth = depth[tnode]
        # pairs(D) = number of (node deeper than D, token below it) pairs.
        hist = np.bincount(tdepth, minlength=max_depth + 1)
        deeper = np.cumsum(hist[::-1])[::-1]  # deeper[d] = tokens with depth >= d
        pairs = np.cumsum(deeper[::-1])[::-1]  # pairs[d] = sum_t max(0, depth_t - d + 1)
        cost = [
            _LEVEL_COST_IN_PAIRS * cut + (int(pairs[cut + 1]) if cut < max_depth else 0)
            for cut in range(max_depth + 1)
        ]
        cut = int(np.argmin(cost))
        self._cut = cut

        # Shallow nodes start from one gather: node v takes the weight of its
        # first own token, or of the identity appended at index vocab_size
        # when it has none; the other own tokens (duplicate byte strings) are
        # folded in by an unbuffered ufunc.at.
        shallow = tdepth <= cut
        s_tok, s_node = tok[shallow], tnode[shallow]
        is_first = np.ones(len(s_node), dtype=bool)
        is_first[1:] = s_node[1:] != s_node[:-1]  # tok is sorted by node
        self._deep_lo = int(level[cut + 1]) if cut < max_depth else self.num_nodes
        self._first_tok = np.full(self._deep_lo, self.vocab_size, dtype=np.int64)
        self._first_tok[s_node[is_first]] = s_tok[is_first]
        self._dup_tok, self._dup_node = s_tok[~is_first], s_node[~is_first]

        # Deep nodes (ids level[cut+1]: onwards): all (node, token) pairs.
        d_tok, d_node = tok[~shallow], tnode[~shallow]
        pair_tok, pair_node = [], []
        while len(d_node):
            pair_tok.append(d_tok)
            pair_node.append(d_node)
            d_node = parent[d_node]
            keep = depth[d_node] > cut
            d_tok, d_node = d_tok[keep], d_node[keep]
        if pair_tok:
            pt, pn = np.concatenate(pair_tok), np.concatenate(pair_node)
            srt = np.argsort(pn, kind="stable")
            self._pair_tok = pt[srt]
            self._pair_start = np.searchsorted(pn[srt], np.arange(self._deep_lo, self.num_nodes))
        else:
            self._pair_tok = np.zeros(0, dtype=np.int64)
            self._pair_start = np.zeros(0, dtype=np.int64)

        # Shallow levels, deepest first: the children at depth c fold into
        # their parents at depth c-1, which are the contiguous ids level[c-1]:
        # level[c]; so one unbuffered ufunc.at into that slice does a level.
        self._steps = [
            (
                int(level[c - 1]),
                int(level[c]),
                int(level[c + 1]),
                parent[level[c] : level[c + 1]] - level[c - 1],
            )
            for c in range(min(cut + 1, max_depth), 0, -1)
        ]

    # ------------------------------------------------------------------ navigation

    def _node(self, node: int) -> int:
        """``node`` as an ``int``, checked: numpy would read a negative id from the end.

        Raises:
            TypeError: ``node`` is not an integer (a float, a bool).
            ValueError: it is not a node of this trie.
        """
        if not is_integer(node):
            raise TypeError(f"node must be an integer node id, got {node!r}")
        if not 0 <= node < self.num_nodes:
            raise ValueError(f"node {node} is not a node of this trie (0..{self.num_nodes - 1})")
        return int(node)

    def children(self, node: int) -> dict[int, int]:
        """``{edge label: child id}`` in increasing edge order (:data:`EOS_EDGE` at the root)."""
        node = self._node(node)
        lo, hi = int(self.child_start[node]), int(self.child_stop[node])
        return dict(zip(self.edge[lo:hi].tolist(), range(lo, hi)))

    def child(self, node: int, byte: int) -> int | None:
        """The child of ``node`` along edge ``byte`` (0..255, or :data:`EOS_EDGE`), or None.

        Raises:
            TypeError: ``node`` or ``byte`` is not an integer (a float, a bool).
            ValueError: ``node`` is not a node of this trie, or ``byte`` is not an edge
                label (the lookup key ``node * 257 + byte`` would name another node's child).
        """
        # Byte-level walks call this once per candidate and byte, so plain ints pass on two
        # type tests and a range test (the node's range only on a miss: a node outside the
        # trie has no key); anything else takes the full checks (numpy integers pass them).
        if node.__class__ is int and byte.__class__ is int and 0 <= byte <= EOS_EDGE:
            found = self._transitions.get(node * 257 + byte)
            if found is not None or 0 <= node < self.num_nodes:
                return found
        return self._transitions.get(self._node(node) * 257 + _edge(byte))

    @cached_property
    def _transitions(self) -> dict[int, int]:
        """One flat dict for O(1) child lookups; built on first use (~0.1 s for 128k tokens)."""
        ids = np.arange(1, self.num_nodes)
        keys = self.parent[1:] * 257 + self.edge[1:]
        return dict(zip(keys.tolist(), ids.tolist()))

    def node_of(self, prefix: bytes) -> int | None:
        """The node whose prefix is ``prefix``, or None if no token starts with it."""
        node: int | None = self.root
        for b in prefix:
            node = self.child(node, b)
            if node is None:
                return None
        return node

    def prefix(self, node: int) -> bytes:
        """The bytes on the path from the root to ``node`` (empty for the root and EOS node)."""
        node = self._node(node)
        out = []
        while node > 0:
            e = int(self.edge[node])
            if e == EOS_EDGE:
                return b""
            out.append(e)
            node = int(self.parent[node])
        return bytes(reversed(out))

    def tokens_at(self, node: int) -> np.ndarray:
        """Sorted ids of the tokens ending exactly at ``node`` (a view: do not modify)."""
        node = self._node(node)
        return self._tokens_by_node[self._tokens_ptr[node] : self._tokens_ptr[node + 1]]

    def tokens_below(self, node: int) -> np.ndarray:
        """Ids of the tokens whose weight counts towards ``node`` (a view: do not modify)."""
        node = self._node(node)
        return self._pre_tokens[self._sub_lo[node] : self._sub_hi[node]]

    # ------------------------------------------------------------------ kernels

    def weight_sum(self, weights: np.ndarray) -> np.ndarray:
        """Total weight of the tokens below each node, accumulated in float64."""
        if _is_torch(weights):
            return self._on_torch("weight_sum", weights, batched=False)
        return self._reduce(self._row(weights), np.add, 0.0)

    def weight_max(self, weights: np.ndarray) -> np.ndarray:
        """Largest weight of the tokens below each node (-inf where there is none)."""
        if _is_torch(weights):
            return self._on_torch("weight_max", weights, batched=False)
        return self._reduce(self._row(weights), np.maximum, -np.inf)

    def batch_weight_sum(self, weights: np.ndarray) -> np.ndarray:
        """Row-wise :meth:`weight_sum`."""
        if _is_torch(weights):
            return self._on_torch("weight_sum", weights, batched=True)
        return self._batch(weights, lambda w, out: self._reduce(w, np.add, 0.0, out))

    def batch_weight_max(self, weights: np.ndarray) -> np.ndarray:
        """Row-wise :meth:`weight_max`."""
        if _is_torch(weights):
            return self._on_torch("weight_max", weights, batched=True)
        return self._batch(weights, lambda w, out: self._reduce(w, np.maximum, -np.inf, out))

    def log_weight_max(self, logprobs: np.ndarray) -> np.ndarray:
        """Largest log-probability below each node; the same as :meth:`weight_max`."""
        return self.weight_max(logprobs)

    def batch_log_weight_max(self, logprobs: np.ndarray) -> np.ndarray:
        """Row-wise :meth:`log_weight_max`."""
        return self.batch_weight_max(logprobs)

    def log_weight_sum(self, logprobs: np.ndarray) -> np.ndarray:
        """Log of the total probability below each node, exact in log space.

        Equal to ``log(weight_sum(exp(logprobs)))`` computed without underflow: correct
        for masses far below float64's range (a node at -800 nats when another token is
        at 0), and -inf only where every token below the node is -inf. A NaN below a node
        makes it NaN, else a +inf below it +inf; other nodes are unaffected by them.
        """
        if _is_torch(logprobs):
            return self._on_torch("log_weight_sum", logprobs, batched=False)
        return self._log_sum(self._row(logprobs), _empty((self.num_nodes,)))

    def batch_log_weight_sum(self, logprobs: np.ndarray) -> np.ndarray:
        """Row-wise :meth:`log_weight_sum`."""
        if _is_torch(logprobs):
            return self._on_torch("log_weight_sum", logprobs, batched=True)
        return self._batch(logprobs, self._log_sum)

    @cached_property
    def _torch_kernel(self):
        """The torch kernel (``_trie_torch``), built on the first torch call."""
        from genlm.core._trie_torch import TorchTrieKernel

        return TorchTrieKernel(self)

    def _on_torch(self, operation: str, weights, batched: bool):
        """Run ``operation`` of the torch kernel on ``weights``' device; a float64 tensor there."""
        _check_real(weights)
        kernel = self._torch_kernel
        out = getattr(kernel, operation)(kernel.rows(weights, batched))
        return out if batched else out[0]

    def _row(self, weights: np.ndarray) -> np.ndarray:
        w = float64_weights(weights)
        if w.shape != (self.vocab_size,):
            raise ValueError(f"expected weights of shape ({self.vocab_size},), got {w.shape}")
        return w

    def _batch(self, weights: np.ndarray, kernel) -> np.ndarray:
        """Check a (B, vocab_size) batch and apply ``kernel(W, out)`` into (B, num_nodes).

        The rows are split into up to :attr:`threads` contiguous chunks, one per
        thread: rows are independent, both kernels release the GIL for their
        work, and where the output is fresh memory (not a pooled block), each
        thread also takes the page faults of its own part of it.
        """
        w = float64_weights(weights)
        if w.ndim != 2 or w.shape[1] != self.vocab_size:
            raise ValueError(f"expected weights of shape (B, {self.vocab_size}), got {w.shape}")
        out = _empty((w.shape[0], self.num_nodes))
        chunks = max(1, min(self.threads, len(w)))  # an empty batch is one empty chunk
        bounds = [len(w) * i // chunks for i in range(chunks + 1)]
        pending = [
            _executor().submit(kernel, w[lo:hi], out[lo:hi])
            for lo, hi in zip(bounds[1:-1], bounds[2:])
        ]
        kernel(w[: bounds[1]], out[: bounds[1]])
        for future in pending:
            future.result()
        return out

    def _reduce(
        self,
        w: np.ndarray,
        op: np.ufunc,
        identity: float,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Bottom-up ``op``-reduction of token weights into every node.

        ``w`` is one row (V,) or a batch (B, V); ``out`` is C-contiguous of the
        matching (num_nodes,) or (B, num_nodes) shape.
        """
        if out is None:
            out = _empty(w.shape[:-1] + (self.num_nodes,))
        if self.kernel == "c":
            rows = 1 if w.ndim == 1 else len(w)
            _trie_kernel.fold(
                np.ascontiguousarray(w),
                out,
                rows,
                self.vocab_size,
                self.num_nodes,
                self._c_tok,
                self._c_tnode,
                self._c_parent,
                op is np.maximum,
                identity,
            )
        elif w.ndim == 2:
            # A row loop over the 1-D sweep beat node-major (V, B) layouts: the
            # per-level work is memory-bound either way, and the loop needs no
            # transposes. (Measured on llama3.2, B=32: a scipy CSR ancestor-matrix
            # product on blocked transposes took ~180 ms of CPU against ~125 ms.)
            for row, dst in zip(w, out):
                self._sweep(row, op, identity, dst)
        else:
            self._sweep(w, op, identity, out)
        return out

    @np.errstate(invalid="ignore")  # NaN and inf - inf are documented values, as in C
    def _sweep(self, w: np.ndarray, op: np.ufunc, identity: float, out: np.ndarray) -> None:
        """The numpy kernel for one row: gathers, deep pairs, then the level sweep."""
        w_ext = np.empty(self.vocab_size + 1)
        w_ext[:-1] = w
        w_ext[-1] = identity
        # mode="clip": the indices are valid, and "raise" would buffer `out`.
        np.take(w_ext, self._first_tok, out=out[: self._deep_lo], mode="clip")
        if len(self._dup_tok):
            op.at(out, self._dup_node, w[self._dup_tok])
        if len(self._pair_start):
            out[self._deep_lo :] = op.reduceat(w[self._pair_tok], self._pair_start)
        for up, lo, hi, par in self._steps:
            op.at(out[up:lo], par, out[lo:hi])

    def _log_sum(self, lp: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Exact log-space weight sums of logprobs (V,) or (B, V) into out (.., num_nodes).

        Each row is shifted by the largest of its finite values (0 if it has none), so a
        NaN or +inf in a row leaves the nodes it is not below exact (module docstring).
        """
        L, res = (lp, out) if lp.ndim == 2 else (lp[None], out[None])
        shift = L.max(axis=1, initial=-np.inf)  # initial: an empty vocabulary's rows
        has_finite = np.isfinite(shift)
        for b in np.flatnonzero(~has_finite):  # rare: a NaN or +inf in the row, or all -inf
            values = L[b][np.isfinite(L[b])]
            has_finite[b] = len(values) > 0
            shift[b] = values.max() if has_finite[b] else 0.0
        shift = shift[:, None]
        with np.errstate(invalid="ignore"):
            self._reduce(np.exp(L - shift), np.add, 0.0, res)
        tiny = res < _TINY
        with np.errstate(divide="ignore", invalid="ignore"):
            np.log(res, out=res)
        res += shift
        for b in np.flatnonzero(has_finite & tiny.any(axis=1)):
            # Nodes whose tokens are all -inf are already right (-inf); skip them
            # so that masked distributions do not pay for the exact path.
            nodes = np.flatnonzero(tiny[b])
            with np.errstate(invalid="ignore"):  # a NaN in the row: its ancestors are not tiny
                peak = self._reduce(L[b], np.maximum, -np.inf)
            nodes = nodes[peak[nodes] > -np.inf]
            res[b, nodes] = self._exact_log_sum(L[b], nodes)
        return out

    def _exact_log_sum(self, lp: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """Log-sum-exp over each node's subtree tokens, shifted by the node's own max."""
        lo, hi = self._sub_lo[nodes], self._sub_hi[nodes]
        n = hi - lo
        out = np.full(len(nodes), -np.inf)
        has = n > 0
        if not has.any():
            return out
        lo, n = lo[has], n[has]
        starts = np.zeros(len(n), dtype=np.int64)
        np.cumsum(n[:-1], out=starts[1:])
        idx = np.repeat(lo - starts, n) + np.arange(int(n.sum()))
        vals = lp[self._pre_tokens[idx]]
        mx = np.maximum.reduceat(vals, starts)
        finite = np.isfinite(mx)
        shift = np.where(finite, mx, 0.0)
        with np.errstate(divide="ignore"):
            res = np.log(np.add.reduceat(np.exp(vals - np.repeat(shift, n)), starts)) + shift
        out[has] = np.where(finite, res, mx)
        return out

    def __repr__(self) -> str:
        return (
            f"TokenByteTrie(vocab_size={self.vocab_size}, num_nodes={self.num_nodes}, "
            f"eos_node={self.eos_node})"
        )


def _empty(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised float64 output, in a pooled C block where the C module is built."""
    if _trie_kernel is None:
        return np.empty(shape)
    n = int(np.prod(shape))
    return np.frombuffer(_trie_kernel.empty(8 * n), dtype=np.float64, count=n).reshape(shape)


def set_trie_pool_limit(nbytes: int) -> int:
    """Cap the memory of freed trie outputs kept for reuse; returns the previous cap.

    Every :class:`TokenByteTrie` shares one pool of at most 8 freed outputs of
    1 MiB or more (module docstring, "Output memory"). ``0`` turns reuse off:
    each output goes back to malloc when freed. Lowering the cap frees pooled
    memory at once. The default cap is 256 MiB. Without the C module there is no pool,
    and this returns 0.

    Raises:
        TypeError: ``nbytes`` is not a whole number (a bool, a string, ``2.5``; a whole
            float such as ``1e9`` counts).
        ValueError: it is negative, or more than ``sys.maxsize`` (the C pool's range).
    """
    nbytes = checked_count("the pool limit (nbytes)", nbytes, 0, whole_floats=True)
    if nbytes > sys.maxsize:
        raise ValueError(f"the pool limit (nbytes) must be at most sys.maxsize, got {nbytes}")
    if _trie_kernel is None:
        return 0
    return _trie_kernel.set_pool_limit(nbytes)


@functools.cache
def _log_installed_kernel() -> None:
    """Say once per process, at the first trie, which kernel ``kernel="auto"`` runs here."""
    if _trie_kernel is not None:
        logger.info("token-byte trie: C kernel (%s)", _trie_kernel.__file__)
    else:  # a kernel that is there but fails to load is a fault worth a warning
        level = logging.INFO if _kernel_error is None else logging.WARNING
        logger.log(level, "token-byte trie: numpy kernel (%s)", _kernel_unavailable())


def _kernel_unavailable() -> str:
    """Why the C kernel is not used: not built, or present and failing with its own error."""
    return unavailable(_KERNEL, "the trie's C kernel", _kernel_error)


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    """The worker threads that batched calls of every trie share, started on first use."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(
                max_workers=_usable_cpus(), thread_name_prefix="genlm-trie"
            )
        return _EXECUTOR


def float64_weights(weights: object) -> np.ndarray:
    """``weights`` (an array, a list, nested lists) as a float64 array, no copy if they are
    one: what the tries take from callers, checked so that nothing silently becomes a
    number.

    Raises:
        TypeError, ValueError: they are not numbers (numpy's error class, with a message
            that says so), are strings (numpy would parse "0.5"), hold None (numpy would
            make it NaN), or are complex (numpy would drop the imaginary parts).
    """
    _check_real(weights)
    try:
        array = np.asarray(weights)
    except (TypeError, ValueError) as error:
        raise _not_numbers(error) from error
    _check_real(array)  # a list of complex rows or numbers is complex only from here
    if array.dtype.kind in "US" or (  # numpy would parse numeric strings ("0.5") as numbers
        array.dtype == object and any(isinstance(w, (str, bytes)) for w in array.flat)
    ):
        raise TypeError(f"weights must be an array of numbers, got strings ({array.dtype})")
    if array.dtype == object and any(w is None for w in array.flat):  # numpy: NaN
        raise TypeError("weights must be an array of numbers, got None among them")
    try:
        return array.astype(np.float64, copy=False)
    except (TypeError, ValueError) as error:
        raise _not_numbers(error) from error


def _not_numbers(error: TypeError | ValueError) -> TypeError | ValueError:
    """numpy's error reading weights, of its class, saying what was expected."""
    cls = TypeError if isinstance(error, TypeError) else ValueError
    return cls(f"weights must be an array of numbers: {error}")


def _ids(ids: Iterable[int], what: str) -> Iterable[int]:
    """``ids``, a collection of token ids; a bare id is a TypeError (a list is meant)."""
    if is_integer(ids) or isinstance(ids, (str, bytes)):
        raise TypeError(f"{what} must be a collection of token ids, got {ids!r}")
    return ids


def _check_id(i: int, V: int, what: str) -> int:
    if not is_integer(i):
        raise TypeError(f"{what} contains {i!r} ({type(i).__name__}), not an integer token id")
    i = int(i)
    if not 0 <= i < V:
        raise ValueError(f"{what} contains {i}, outside the vocabulary range [0, {V})")
    return i


def _edge(byte: int) -> int:
    """``byte`` as an ``int`` edge label (0..255, or :data:`EOS_EDGE`).

    Raises:
        TypeError: it is not an integer (a float, a bool).
        ValueError: it is outside 0..EOS_EDGE.
    """
    if not is_integer(byte):
        raise TypeError(f"an edge label must be an integer byte, got {byte!r}")
    if not 0 <= byte <= EOS_EDGE:
        raise ValueError(f"edge label {byte} is not a byte (0..255) or EOS_EDGE ({EOS_EDGE})")
    return int(byte)


def _adjacent_lcp(flat: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Longest common prefix of each string with its predecessor (0 for the first).

    Column by column over the pairs still equal so far, so the work is the sum
    of the LCPs, not the length of the longest string times their number.
    """
    lcp = np.zeros(len(lens), dtype=np.int64)
    active = np.arange(1, len(lens))
    k = 0
    while len(active):
        active = active[(lens[active] > k) & (lens[active - 1] > k)]
        active = active[flat[offs[active] + k] == flat[offs[active - 1] + k]]
        k += 1
        lcp[active] = k
    return lcp
