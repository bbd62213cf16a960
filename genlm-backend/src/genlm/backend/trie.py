"""genlm-backend's token-character tries, as facades over :class:`genlm.core.TokenByteTrie`.

Node layout (what genlm-backend documents and its clients walk): ``children[node]`` maps a byte
(an int) to the child node, and ``(None, position)`` to the *leaf* of the vocabulary entry at that
position (keyed by position, as in genlm-backend 0.3.1, so two entries ending at one node never
share a key); ``root`` is 0.
The prefix nodes are core's (same ids: ``0 .. core.num_nodes - 1``); token ``i``'s leaf is node
``core.num_nodes + i``. ``weight_sum``/``weight_max`` return one value per node: core's prefix
masses (float64), then each token's own weight at its leaf. There is one trie implementation,
core's: host rows (numpy, lists, CPU tensors) go to its C kernel, tensors on another device to its
torch kernel on that device, and only the assembled masses come back to the host as numpy.
``ParallelTokenCharacterTrie`` is the same trie, taking the device argument for compatibility.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from genlm.backend.tokenization import Token
from genlm.core import AsyncTokenByteTrie, TokenByteTrie
from genlm.core.backend import check_real, float64_weights, is_torch


@attrs.frozen
class _Words:
    """The entries core's trie does not hold (str words, genlm-control's ``EOS``, empty byte
    strings): each adds its weight at every node of its path, root included.

    Attributes:
        nodes: the distinct nodes on those paths, ascending.
        leaves: the leaves of the entries through each node, grouped by node.
        starts: where each node's group begins in ``leaves``.
    """

    nodes: np.ndarray
    leaves: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, pairs: list[tuple[int, int]]) -> _Words:
        """From ``(node, leaf)`` pairs, one per node of each word's path."""
        pairs = sorted(pairs)
        nodes = np.array([node for node, _ in pairs], dtype=np.int64)
        leaves = np.array([leaf for _, leaf in pairs], dtype=np.int64)
        distinct, starts = np.unique(nodes, return_index=True)
        return cls(distinct, leaves, starts.astype(np.int64))

    def fold(self, out: np.ndarray, use_max: bool) -> None:
        """Fold each word's weight, read at its leaf in ``out``, into its path's nodes."""
        if not len(self.nodes):
            return
        op = np.maximum if use_max else np.add
        words = op.reduceat(out[..., self.leaves], self.starts, axis=-1)
        out[..., self.nodes] = op(out[..., self.nodes], words)


class TokenCharacterTrie:
    """A trie over the bytes of a vocabulary, with per-node weight sums and maxima.

    Args:
        decode: the vocabulary; weights are indexed by position in it. Bytes entries
            (:class:`Token` or plain bytes) are spelled by their bytes (edges are ints) and
            summed by core's trie. Any other entry (a str, genlm-control's ``EOS``) is a word
            whose letters are the items it iterates over (a str's characters): it gets its own
            nodes, and its weight is added along its path.

    Attributes:
        decode (list): the vocabulary, as given.
        root (int): the root node (0).
        children (list[dict]): ``children[node]`` maps a letter (a byte as an int, or another
            entry's item) to a child, and ``(None, position)`` to the leaf of the entry at that
            position in ``decode`` (a Token's id is in ``word2leaf``'s key instead).
        word2leaf (dict): ``(byte_string, token_id)`` for a Token, else the entry -> leaf.
        leaf2word (dict): leaf node -> its ``word2leaf`` key.
        token_id_to_leaf (np.ndarray): ``(V, 2)`` rows of ``(token_id or position, leaf)``.
        idx_to_leaf (np.ndarray): ``(V, 2)`` int32 rows of ``(position, leaf)``, 0.3.1's name.
        node2prefix (dict): node -> the list of letters from the root to it (a leaf: its
            entry's), as 0.3.1 has it; built on first use.
        core (genlm.core.TokenByteTrie): the core trie that computes the prefix masses.
    """

    def __init__(self, decode: Sequence[Any]):
        self.decode = list(decode)
        self.core = TokenByteTrie([_spelling(t) for t in self.decode])
        self.root = self.core.root
        prefix_nodes = self.num_prefix_nodes = self.core.num_nodes
        V = len(self.decode)
        self.children: list[dict[Any, int]] = [{} for _ in range(prefix_nodes + V)]
        for node, (parent, edge) in enumerate(
            zip(self.core.parent[1:].tolist(), self.core.edge[1:].tolist()), start=1
        ):
            self.children[parent][edge] = node
        token_node = self.core.token_node.tolist()
        self.word2leaf: dict[Any, int] = {}
        # Entries core cannot sum (str and other words, empty byte strings) add their weight
        # along their path: (node, leaf) pairs, one per path node.
        word_pairs: list[tuple[int, int]] = []
        ids = []
        for position, entry in enumerate(self.decode):
            leaf = prefix_nodes + position
            if isinstance(entry, bytes) and token_node[position] >= 0:
                parent = token_node[position]
            else:
                path = self._add_path(entry)
                parent = path[-1]
                word_pairs += [(node, leaf) for node in path]
            key = (entry.byte_string, entry.token_id) if isinstance(entry, Token) else entry
            tid = entry.token_id if isinstance(entry, Token) else position
            if key in self.word2leaf:
                raise ValueError(f"vocabulary entry {position} repeats {key!r}")
            self.children[parent][(None, position)] = leaf
            self.word2leaf[key] = leaf
            ids.append(tid)
        self._words = _Words.of(word_pairs)
        self.leaf2word = {leaf: word for word, leaf in self.word2leaf.items()}
        leaves = prefix_nodes + np.arange(V, dtype=np.int64)
        self.token_id_to_leaf = np.stack([np.asarray(ids, dtype=np.int64), leaves], axis=1)
        self.idx_to_leaf = np.stack([np.arange(V), leaves], axis=1).astype(np.int32)

    @functools.cached_property
    def node2prefix(self) -> dict[int, list[Any]]:
        """Each node's letters from the root (a leaf's: its entry's), as genlm-backend 0.3.1
        published it. Built on first use: llama3.2's trie has 400k nodes, and genlm-control
        never reads it."""
        prefix: dict[int, list[Any]] = {self.root: []}
        stack = [self.root]
        while stack:
            node = stack.pop()
            for letter, child in self.children[node].items():
                leaf = isinstance(letter, tuple) and letter[0] is None
                prefix[child] = prefix[node] if leaf else [*prefix[node], letter]
                stack.append(child)
        return prefix

    def _add_path(self, entry: Any) -> list[int]:
        """Nodes for a word core does not hold, created as needed; returns its root path."""
        node, path = self.root, [self.root]
        letters = [] if isinstance(entry, bytes) else list(entry)
        for letter in letters:
            child = self.children[node].get(letter)
            if child is None:
                child = len(self.children)
                self.children.append({})
                self.children[node][letter] = child
            node = child
            path.append(node)
        return path

    @property
    def num_nodes(self) -> int:
        """Prefix nodes, one leaf per entry, and the nodes of non-bytes words."""
        return len(self.children)

    def _weights(self, ws: Any, batched: bool) -> Any:
        """``ws`` as core's kernel takes it: a float64 array, or a tensor on a non-CPU device.

        A batch may be a list of rows (genlm-backend 0.3.1 documents
        ``list[torch.Tensor | np.ndarray]``): tensor rows are stacked by torch
        (:func:`_stacked`), since numpy reads neither bfloat16 nor device tensors.

        Rows wider than ``decode`` are read up to its length: a model whose logit rows are
        padded beyond its tokenizer gives rows wider than its ``byte_vocab`` (which lists
        the tokenizer's tokens), and 0.3.1's trie ignored the padding likewise.

        Raises:
            ValueError: ``ws`` has fewer weights than entries, or is not a ``(B, V)`` batch
                where ``batched``.
            TypeError: ``ws`` is complex (a cast would drop the imaginary parts).
        """
        if batched and isinstance(ws, (list, tuple)) and any(map(is_torch, ws)):
            ws = _stacked(ws)
        check_real(ws)
        if is_torch(ws):
            ws = ws.detach()
            if ws.device.type == "cpu":  # core's C kernel beats its torch kernel on the CPU
                ws = ws.double().numpy()  # widened by torch: numpy has no bfloat16
        else:
            ws = float64_weights(ws)  # refuses strings, None and complex numbers
        if ws.ndim != (2 if batched else 1) or ws.shape[-1] < len(self.decode):
            raise ValueError(
                f"weights of shape {tuple(ws.shape)} do not match a vocabulary of "
                f"{len(self.decode)}" + (" (expected a batch of rows)" if batched else "")
            )
        return ws[..., : len(self.decode)]

    def _with_leaves(self, prefix: Any, w: Any, use_max: bool) -> np.ndarray:
        """Core's prefix values, each entry's weight at its leaf and the words' nodes.

        Assembled where the rows live (one copy to the host for device rows), then the words
        core does not hold are folded in from their leaves.
        """
        n, V = self.num_prefix_nodes, len(self.decode)
        fill = -np.inf if use_max else 0.0
        shape = (*w.shape[:-1], self.num_nodes)
        out = w.new_full(shape, fill, dtype=prefix.dtype) if is_torch(w) else np.full(shape, fill)
        out[..., :n] = prefix
        out[..., n : n + V] = w
        if is_torch(out):
            out = out.cpu().numpy()
        self._words.fold(out, use_max)
        return out

    def weight_sum(self, ws: Any) -> np.ndarray:
        """Total weight of the entries below each node (a leaf: its entry's weight).

        Args:
            ws: one weight per entry (``(V,)``), numpy, list or torch on any device.

        Returns:
            A float64 ``(num_nodes,)`` array.

        Raises:
            ValueError: ``ws`` does not have one weight per entry.
        """
        w = self._weights(ws, batched=False)
        return self._with_leaves(self.core.weight_sum(w), w, use_max=False)

    def weight_max(self, ws: Any) -> np.ndarray:
        """Largest weight of the entries below each node (-inf where none); ``(num_nodes,)``."""
        w = self._weights(ws, batched=False)
        return self._with_leaves(self.core.weight_max(w), w, use_max=True)

    def batch_weight_sum(self, ws: Any) -> np.ndarray:
        """Row-wise :meth:`weight_sum`: ``(B, V)`` -> ``(B, num_nodes)``."""
        w = self._weights(ws, batched=True)
        return self._with_leaves(self.core.batch_weight_sum(w), w, use_max=False)

    def batch_weight_max(self, ws: Any) -> np.ndarray:
        """Row-wise :meth:`weight_max`: ``(B, V)`` -> ``(B, num_nodes)``."""
        w = self._weights(ws, batched=True)
        return self._with_leaves(self.core.batch_weight_max(w), w, use_max=True)

    def visualize(self, ws: Any = None) -> Any:
        """A graphviz ``Digraph`` of the trie, each node labelled with its value in ``ws``.

        Args:
            ws: one value per node (``(num_nodes,)``, e.g. what :meth:`weight_sum`
                returned, as genlm-backend's README passes its masses), or one weight per
                entry (``(V,)``), whose sums are shown; None draws the bare trie. A trie
                has more nodes than entries, so the two cannot be confused.

        Meant for small vocabularies (it draws every node). Needs the ``graphviz`` package.
        """
        import graphviz

        mass = None
        if ws is not None:
            values = ws.detach().cpu().double().numpy() if is_torch(ws) else np.asarray(ws)
            per_node = values.shape == (self.num_nodes,)
            mass = values.astype(np.float64) if per_node else self.weight_sum(ws)
        dot = graphviz.Digraph(graph_attr={"rankdir": "LR"})
        for node, edges in enumerate(self.children):
            label = "" if mass is None else f"{mass[node]:.3g}"
            if node in self.leaf2word:
                key = self.leaf2word[node]
                word = key[0].decode("utf-8", errors="replace") if isinstance(key, tuple) else key
                dot.node(str(node), f"{word!r}\n{label}", shape="box")
            else:
                dot.node(str(node), label or str(node), shape="circle")
            for key, child in edges.items():
                text = (
                    "EOT"
                    if isinstance(key, tuple)
                    else repr(chr(key) if isinstance(key, int) else key)
                )
                dot.edge(str(node), str(child), label=text)
        return dot


class ParallelTokenCharacterTrie(TokenCharacterTrie):
    """genlm-backend's GPU trie; here the same trie, reducing rows where they live.

    Args:
        decode: as for :class:`TokenCharacterTrie`.
        device: ``"cpu"``, ``"cuda"`` or None, for compatibility (another is a
            ``ValueError``): a tensor on a GPU is reduced on its GPU by core's torch kernel,
            host rows by core's threaded C kernel; results are numpy float64.
        **kwargs: accepted for compatibility (e.g. ``max_batch_size``) and ignored.
    """

    def __init__(self, decode: Sequence[Any], device: str | None = None, **kwargs: Any):
        if device not in (None, "cpu", "cuda"):
            raise ValueError(f"device must be 'cpu', 'cuda' or None, got {device!r}")
        super().__init__(decode)
        self.device = device or "cpu"


class AsyncTokenCharacterTrie:
    """Concurrent ``weight_sum``/``weight_max`` calls batched into one kernel call.

    Batching is core's :class:`genlm.core.AsyncTokenByteTrie` (the project's one scheduler);
    this adds the leaves.

    Args:
        trie: a :class:`TokenCharacterTrie` (or :class:`ParallelTokenCharacterTrie`), the
            tries 0.3.1 documents for it.
        **kwargs: :class:`genlm.core.AsyncTokenByteTrie` options (``max_batch_size``, ...).

    Raises:
        TypeError: ``trie`` is not one (a vocabulary, say: :meth:`from_vocab` builds a trie
            over one), here rather than as an ``AttributeError`` from inside each call.
    """

    def __init__(self, trie: TokenCharacterTrie, **kwargs: Any):
        if not isinstance(trie, TokenCharacterTrie):
            raise TypeError(
                "trie must be a TokenCharacterTrie (AsyncTokenCharacterTrie.from_vocab(vocab) "
                f"builds one over a vocabulary), got {type(trie).__name__} {trie!r:.60}"
            )
        self.trie = trie
        self._options = kwargs
        self._core: AsyncTokenByteTrie | None = None

    @classmethod
    def from_vocab(
        cls, vocab: Sequence[Any], backend: str = "parallel", **kwargs: Any
    ) -> AsyncTokenCharacterTrie:
        """An async trie over ``vocab``: a :class:`ParallelTokenCharacterTrie` (``backend=
        "parallel"``) or a :class:`TokenCharacterTrie` (``"sequential"``), ``kwargs`` going
        to its constructor.

        Raises:
            ValueError: another ``backend``.
        """
        if backend == "sequential":
            return cls(TokenCharacterTrie(vocab, **kwargs))
        if backend == "parallel":
            return cls(ParallelTokenCharacterTrie(vocab, **kwargs))
        raise ValueError(f"backend must be 'sequential' or 'parallel', got {backend!r}")

    @property
    def core(self) -> AsyncTokenByteTrie:
        """The batching machinery, made on first use and again after :meth:`cleanup`."""
        if self._core is None:
            self._core = AsyncTokenByteTrie(self.trie.core, **self._options)
        return self._core

    async def weight_sum(self, ws: Any) -> np.ndarray:
        """:meth:`TokenCharacterTrie.weight_sum`, batched with concurrent calls."""
        w = self._snapshot(ws)
        return self.trie._with_leaves(await self.core.weight_sum(w), w, use_max=False)

    async def weight_max(self, ws: Any) -> np.ndarray:
        """:meth:`TokenCharacterTrie.weight_max`, batched with concurrent calls."""
        w = self._snapshot(ws)
        return self.trie._with_leaves(await self.core.weight_max(w), w, use_max=True)

    def _snapshot(self, ws: Any) -> Any:
        """The row as the trie reads it, copied now: the leaves are read after the wait, and
        a caller may refill its buffer meanwhile (the prefix masses would be the old row's,
        the leaves the new one's)."""
        w = self.trie._weights(ws, batched=False)
        return w.clone() if is_torch(w) else w.copy()

    def start(self) -> None:
        """Nothing to start: batches run when requests arrive (kept for compatibility)."""

    async def cleanup(self) -> None:
        """Release the batching machinery (its worker thread); a later call makes it
        anew, as genlm-backend's trie restarts its task."""
        core, self._core = self._core, None
        if core is not None:
            await core.aclose()

    def shutdown(self) -> None:
        """:meth:`cleanup` without awaiting: queued calls fail, the running one finishes,
        then the worker thread stops; a later call makes the machinery anew."""
        core, self._core = self._core, None
        if core is not None:
            core.batcher.reject_new()  # queued calls fail with ModelClosedError
            core.worker.close(wait=False)


def _stacked(rows: Sequence[Any]) -> Any:
    """A batch given as a list of rows, some of them tensors, as one ``(B, V)`` batch.

    Tensor rows on one device (and no other rows) are stacked there as float64, so core's
    torch kernel reduces them on that device; otherwise each tensor row is read on the host.
    Tensors are widened by torch: numpy reads no bfloat16 and no device memory.

    Raises:
        ValueError: the rows differ in shape.
        TypeError: a tensor row is complex.
    """
    import torch  # already imported: some rows are tensors

    shapes = {tuple(np.shape(row)) for row in rows}
    if len(shapes) > 1:
        raise ValueError(f"the rows of a batch differ in shape: {sorted(shapes)}")
    tensors = [row.detach() for row in rows if is_torch(row)]
    for tensor in tensors:
        check_real(tensor)
    if len(tensors) == len(rows) and len({t.device for t in tensors}) == 1:
        return torch.stack([t.to(torch.float64) for t in tensors])
    return np.stack(
        [row.detach().double().cpu().numpy() if is_torch(row) else np.asarray(row) for row in rows]
    )


def _spelling(entry: Any) -> bytes:
    """What core's trie holds for an entry: its bytes, or b"" (nothing) for other words."""
    return bytes(entry) if isinstance(entry, bytes) else b""
