"""The token-byte trie's torch kernel: prefix masses of rows that stay on their device.

:class:`~genlm.core.TokenByteTrie` hands torch tensors here (only then is torch
imported), so rows a model left on a GPU are reduced there and never cross to the host.

Design (why it suits a GPU)
---------------------------
The CPU kernels fold the trie level by level, ~128 dependent levels for gpt2 or
llama3.2; on a GPU each level would be a kernel launch of a few microseconds over few
nodes. Instead almost all the work is two launches over a flat list of (node, token)
pairs, built once per trie and device:

* every token is paired with its own node and with each ancestor deeper than
  :data:`FOLD_DEPTH` (llama3.2: ~0.8M pairs for 128k tokens);
* one gather ``w[:, pair_token]`` and one scatter (``index_add_`` for sums,
  ``scatter_reduce_(amax)`` for maxes) into ``(B, num_nodes)`` give every node deeper
  than :data:`FOLD_DEPTH` its complete value, and shallow nodes their own tokens;
* the :data:`FOLD_DEPTH` + 1 shallowest levels are then folded child into parent, one
  scatter per level (their nodes are contiguous ids, parents are contiguous one
  level up).

Why not pair every ancestor: the root would receive one atomic add per token
(serialised on one address) and each depth-1 node thousands; folded, a shallow node
receives at most 257 (one per child), and the deepest contention left is the token count
below one depth-2 node. A sparse ancestor-matrix product (cuSPARSE) would do the sums
but offers no max, and the log form below needs both.

dtype: float64 throughout. The rows arrive in float32 (or bf16) and are widened on the
device; accumulating in float64 keeps a node's sum within ``depth * eps64`` of the
exact value, as the CPU kernels do, so results equal the float64 CPU kernel up to
summation order (about 1e-15 relative, far inside float32 rounding), whatever the sizes
of the other masses. The kernel is memory-bound (one gather and one scatter of
``B * pairs`` elements), so float64 costs bandwidth, not the H100's slower float64
arithmetic; float32 would halve the bytes but lose small masses next to large ones.

Log space: each node is shifted by its own maximum logprob (from the max kernel), so no
node underflows however far below the row maximum it lies; a child folds into its
parent scaled by ``exp(max_child - max_parent) <= 1``. Exact for any finite logprobs,
``-inf`` only where every token below a node is ``-inf``; NaN and +inf reach exactly the
nodes above them, as in the CPU kernels (``_trie``'s "Kernels").
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np
import torch


class TrieArrays(Protocol):
    """What the kernel reads of a :class:`~genlm.core.TokenByteTrie` (a protocol, so this
    module does not import ``_trie``, which imports it: no import circle)."""

    token_node: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    _level: np.ndarray
    vocab_size: int
    num_nodes: int


#: Levels 0..FOLD_DEPTH are folded level by level; deeper nodes get all their pairs.
FOLD_DEPTH = 1


def pairs_and_folds(
    trie: TrieArrays, fold_depth: int = FOLD_DEPTH
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int, np.ndarray]]]:
    """``(pair_node, pair_token, folds)``, the torch kernel's plan as numpy arrays.

    Token ``pair_token[k]`` adds to node ``pair_node[k]``; ``folds`` are ``(up, lo, hi,
    parent)`` steps, deepest first: nodes ``lo:hi`` fold into nodes ``up + parent``.
    """
    token_node = trie.token_node
    tokens = np.flatnonzero(token_node >= 0)
    nodes = token_node[tokens]
    pair_node, pair_token = [nodes], [tokens]
    node, token = trie.parent[nodes], tokens
    while len(node):  # walk up while ancestors are deeper than the fold depth
        keep = (node >= 0) & (trie.depth[np.maximum(node, 0)] > fold_depth)
        node, token = node[keep], token[keep]
        pair_node.append(node)
        pair_token.append(token)
        node = trie.parent[node]
    level = trie._level
    folds = [
        (int(level[c - 1]), int(level[c]), int(level[c + 1]), trie.parent[level[c] : level[c + 1]])
        for c in range(min(fold_depth + 1, len(level) - 2), 0, -1)
    ]
    folds = [(up, lo, hi, par - up) for up, lo, hi, par in folds]
    return np.concatenate(pair_node), np.concatenate(pair_token), folds


class TorchTrieKernel:
    """Weight sums and maxes of torch rows, computed on the rows' device (float64)."""

    def __init__(self, trie: TrieArrays):
        self.vocab_size = trie.vocab_size
        self.num_nodes = trie.num_nodes
        self._host = pairs_and_folds(trie)
        self._plans: dict[torch.device, tuple] = {}
        self._lock = threading.Lock()

    def _plan(self, device: torch.device) -> tuple:
        """The index tensors on ``device``, copied there on first use."""
        with self._lock:
            plan = self._plans.get(device)
            if plan is None:
                pair_node, pair_token, folds = self._host

                def put(a: np.ndarray) -> torch.Tensor:
                    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)

                plan = self._plans[device] = (
                    put(pair_node),
                    put(pair_token),
                    [(up, lo, hi, put(par)) for up, lo, hi, par in folds],
                )
            return plan

    def rows(self, weights: torch.Tensor, batched: bool) -> torch.Tensor:
        """``weights`` checked and widened to float64 (B, V), on its own device."""
        if batched:
            if weights.ndim != 2 or weights.shape[1] != self.vocab_size:
                raise ValueError(
                    f"expected weights of shape (B, {self.vocab_size}), got {tuple(weights.shape)}"
                )
            return weights.detach().to(torch.float64)
        if tuple(weights.shape) != (self.vocab_size,):
            raise ValueError(
                f"expected weights of shape ({self.vocab_size},), got {tuple(weights.shape)}"
            )
        return weights.detach().to(torch.float64).unsqueeze(0)

    def weight_sum(self, w: torch.Tensor) -> torch.Tensor:
        """(B, V) float64 -> (B, num_nodes): the total weight below each node."""
        pair_node, pair_token, folds = self._plan(w.device)
        out = torch.zeros(w.shape[0], self.num_nodes, dtype=torch.float64, device=w.device)
        out.index_add_(1, pair_node, w[:, pair_token])
        for up, lo, hi, parent in folds:
            out[:, up:lo].index_add_(1, parent, out[:, lo:hi])
        return out

    def weight_max(self, w: torch.Tensor) -> torch.Tensor:
        """(B, V) float64 -> (B, num_nodes): the largest weight below each node (-inf: none)."""
        pair_node, pair_token, folds = self._plan(w.device)
        b = w.shape[0]
        out = torch.full((b, self.num_nodes), -torch.inf, dtype=torch.float64, device=w.device)
        out.scatter_reduce_(1, pair_node.expand(b, -1), w[:, pair_token], "amax")
        for up, lo, hi, parent in folds:
            out[:, up:lo].scatter_reduce_(1, parent.expand(b, -1), out[:, lo:hi], "amax")
        return out

    def log_weight_sum(self, lp: torch.Tensor) -> torch.Tensor:
        """(B, V) logprobs -> (B, num_nodes): log of the mass below each node, per-node shifted."""
        pair_node, pair_token, folds = self._plan(lp.device)
        peak = self.weight_max(lp)
        shift = torch.where(torch.isfinite(peak), peak, 0.0)
        scaled = torch.zeros_like(peak)
        scaled.index_add_(1, pair_node, torch.exp(lp[:, pair_token] - shift[:, pair_node]))
        for up, lo, hi, parent in folds:
            child = scaled[:, lo:hi]
            factor = torch.exp(shift[:, lo:hi] - shift[:, up:lo][:, parent])
            # A child with no mass adds nothing (its factor may overflow next to it); a NaN
            # child adds NaN, as the CPU kernels' sums do.
            scaled[:, up:lo].index_add_(1, parent, torch.where(child != 0, child * factor, 0.0))
        return torch.log(scaled) + shift
