"""The published genlm-bytes 0.2 trie API (``genlm.bytes.trie``) over genlm-core's trie.

``TokenByteTrie(decode, eos_tokens=...)`` and ``AsyncTokenByteTrie`` compute, for every
trie node, the total (or largest) weight of the tokens whose bytes start with the node's
prefix, in the two documented modes: ``TrieMode.WITHOUT_EOS`` counts EOS tokens as the
bytes they spell; ``TrieMode.WITH_EOS`` moves their weight to one EOS node, a child of
the root. The work is :class:`genlm.core.TokenByteTrie`'s (its C kernel, float64); this
module only adds the EOS node (the last index) and accepts torch tensors without
importing torch. Results are numpy float64 arrays, as the published docs say.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from genlm.bytes._params import TrieMode
from genlm.core import AsyncTokenByteTrie as CoreAsyncTrie
from genlm.core import TokenByteTrie as CoreTrie

__all__ = ["AsyncTokenByteTrie", "TokenByteTrie", "TrieMode"]


def _as_numpy(ws: Any) -> np.ndarray:
    """A float64 array from numpy data or a torch tensor (on any device)."""
    if hasattr(ws, "detach"):  # a torch tensor: no torch import needed
        ws = ws.detach().cpu().numpy()
    return np.asarray(ws, dtype=np.float64)


class TokenByteTrie:
    """A token vocabulary's byte trie with per-node weight sums and maxima.

    Args:
        decode: ``decode[i]`` is token ``i``'s bytes.
        device: accepted for compatibility (``None``, ``"cpu"`` or ``"cuda"``); the trie
            always computes on the CPU.
        atomic_tokens: tokens (bytes) that are not spelled by their bytes; their weight
            counts nowhere (unless they are EOS tokens, in ``WITH_EOS`` mode).
        eot_token: accepted for compatibility; the end of a token is not a node here.
        eos_tokens: tokens (bytes) that end the sequence in ``WITH_EOS`` mode.
        max_batch_size: accepted for compatibility (rows are computed together anyway).

    Attributes:
        core: the :class:`genlm.core.TokenByteTrie` doing the work.
        root: the root node (0).
        eos_node: the EOS node, the last index (``num_nodes - 1``).
        num_nodes: nodes of the results, the EOS node included.

    Raises:
        ValueError: an unknown device.
    """

    def __init__(
        self,
        decode: Sequence[bytes],
        device: str | None = None,
        atomic_tokens: Sequence[bytes] | None = None,
        eot_token: bytes | None = None,
        eos_tokens: Sequence[bytes] | None = None,
        max_batch_size: int = 64,
    ):
        if device not in (None, "cpu", "cuda"):
            raise ValueError(f"Invalid device: {device!r}. Must be 'cpu', 'cuda' or None")
        self.decode = [bytes(t) for t in decode]
        self.device = "cpu"
        self.eot_token = eot_token
        self.max_batch_size = max_batch_size
        self.eos_tokens = set(eos_tokens or ())
        self.eos_token_ids = [i for i, t in enumerate(self.decode) if t in self.eos_tokens]
        atomic = set(atomic_tokens or ())
        self.core = CoreTrie(
            self.decode, atomic_ids=[i for i, t in enumerate(self.decode) if t in atomic]
        )
        self.root = self.core.root
        self.eos_node = self.core.num_nodes
        self.num_nodes = self.core.num_nodes + 1

    @property
    def node2prefix(self) -> list[bytes]:
        """Each node's byte prefix (the EOS node's is empty)."""
        return [self.core.prefix(v) for v in range(self.core.num_nodes)] + [b""]

    def prepare(self, ws: Any, mode: TrieMode | None) -> tuple[np.ndarray, np.ndarray]:
        """``(weights the core trie sums, EOS weight per row)`` for rows ``ws`` in ``mode``.

        ``WITH_EOS`` takes the EOS tokens' weight out of their bytes' nodes.
        """
        w = np.atleast_2d(_as_numpy(ws))
        if w.shape[1] != len(self.decode):
            raise ValueError(f"expected rows of {len(self.decode)} weights, got shape {w.shape}")
        eos = np.zeros(len(w))
        if TrieMode(mode or TrieMode.WITHOUT_EOS) is TrieMode.WITH_EOS and self.eos_token_ids:
            eos = w[:, self.eos_token_ids].sum(axis=1)
            w = w.copy()
            w[:, self.eos_token_ids] = 0.0
        return w, eos

    def finish(self, masses: np.ndarray, eos: np.ndarray) -> np.ndarray:
        """The core trie's sums with the EOS node appended (and counted at the root)."""
        out = np.concatenate([np.atleast_2d(masses), eos[:, None]], axis=1)
        out[:, self.root] += eos
        return out

    def weight_sum(self, ws: Any, mode: TrieMode | None = None) -> np.ndarray:
        """Total weight of the tokens below each node: ``(num_nodes,)`` float64.

        Args:
            ws: token weights (probabilities), shape ``(len(decode),)``; numpy or torch.
            mode: ``TrieMode.WITHOUT_EOS`` (the default) or ``WITH_EOS``.
        """
        return self.batch_weight_sum(np.atleast_2d(_as_numpy(ws)), mode)[0]

    def batch_weight_sum(self, ws: Any, mode: TrieMode | None = None) -> np.ndarray:
        """Row-wise :meth:`weight_sum`: ``(B, len(decode)) -> (B, num_nodes)``."""
        w, eos = self.prepare(ws, mode)
        return self.finish(self.core.batch_weight_sum(w), eos)

    def weight_max(self, ws: Any) -> np.ndarray:
        """Largest weight of the tokens below each node (-inf where none), ``WITHOUT_EOS``
        structure; the EOS node holds the largest EOS token weight."""
        return self.batch_weight_max(np.atleast_2d(_as_numpy(ws)))[0]

    def batch_weight_max(self, ws: Any) -> np.ndarray:
        """Row-wise :meth:`weight_max`: ``(B, len(decode)) -> (B, num_nodes)``."""
        w = np.atleast_2d(_as_numpy(ws))
        return np.concatenate([self.core.batch_weight_max(w), self.eos_max(w)[:, None]], axis=1)

    def eos_max(self, w: np.ndarray) -> np.ndarray:
        """The largest EOS token weight of each row of ``w`` (-inf without EOS tokens)."""
        if not self.eos_token_ids:
            return np.full(len(w), -np.inf)
        return w[:, self.eos_token_ids].max(axis=1)


class AsyncTokenByteTrie:
    """:class:`TokenByteTrie` computations awaited, concurrent calls batched (through
    genlm-core's ``AsyncTokenByteTrie`` and its scheduler).

    Args:
        trie: the trie to compute over.
    """

    def __init__(self, trie: TokenByteTrie):
        self.trie = trie
        self._async: CoreAsyncTrie | None = None

    @classmethod
    def from_vocab(cls, vocab: Sequence[bytes], **kwargs: Any) -> AsyncTokenByteTrie:
        """``AsyncTokenByteTrie(TokenByteTrie(vocab, **kwargs))``."""
        return cls(TokenByteTrie(vocab, **kwargs))

    def start(self) -> None:
        """Make the batching worker (also done by the first call)."""
        if self._async is None:
            self._async = CoreAsyncTrie(self.trie.core, max_batch_size=self.trie.max_batch_size)

    async def weight_sum(self, ws: Any, mode: TrieMode | None = None) -> np.ndarray:
        """:meth:`TokenByteTrie.weight_sum`, batched with concurrent calls."""
        self.start()
        w, eos = self.trie.prepare(ws, mode)
        return self.trie.finish(await self._async.weight_sum(w[0]), eos)[0]

    async def weight_max(self, ws: Any) -> np.ndarray:
        """:meth:`TokenByteTrie.weight_max`, batched with concurrent calls."""
        self.start()
        w = _as_numpy(ws)
        masses = await self._async.weight_max(w)
        return np.concatenate([masses, self.trie.eos_max(w[None, :])])

    async def cleanup(self) -> None:
        """Stop the worker (a later call starts a new one)."""
        if self._async is not None:
            running, self._async = self._async, None
            await running.aclose()

    def shutdown(self) -> None:
        """Stop the worker without waiting for it (the synchronous :meth:`cleanup`)."""
        if self._async is not None:
            running, self._async = self._async, None
            running.worker.close(wait=False)
