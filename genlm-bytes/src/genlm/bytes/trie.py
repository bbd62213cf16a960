"""The published genlm-bytes 0.2 trie API (``genlm.bytes.trie``) over genlm-core's trie.

Part of the 0.2 layer (with ``genlm.bytes.byte_lm``): the byte model never imports it.
:class:`EosModeTrie` (published as ``TokenByteTrie``) and :class:`AsyncEosModeTrie`
(``AsyncTokenByteTrie``) compute, for every trie node, the total (or largest) weight of
the tokens whose bytes start with the node's prefix, in the two documented modes chosen
per call: ``TrieMode.WITHOUT_EOS`` counts EOS tokens as the bytes they spell;
``TrieMode.WITH_EOS`` moves their weight to one EOS node, a child of the root kept as the
last index. That per-call mode and the EOS node's place are how it differs from
:class:`genlm.core.TokenByteTrie`, whose EOS ids are fixed when it is built and whose EOS
node sits among the root's children; the work is that class's (its C kernel, float64), the
EOS weight is taken out by ``genlm.bytes._eos.split_eos`` as the byte model's is. Torch
tensors are accepted without importing torch; results are numpy float64 arrays, as the
published docs say.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import numpy as np

from genlm.bytes._aliases import either_byte_strings, either_name
from genlm.bytes._eos import split_eos
from genlm.core import AsyncTokenByteTrie as CoreAsyncTrie
from genlm.core import TokenByteTrie as CoreTrie
from genlm.core.backend import check_real, check_token_bytes, is_torch

__all__ = [
    "AsyncEosModeTrie",
    "AsyncTokenByteTrie",
    "EosModeTrie",
    "TokenByteTrie",
    "TrieMode",
]


class TrieMode(enum.Enum):
    """How EOS tokens that are ordinary text count (the published API's trie modes; here,
    as in genlm-bytes 0.2, and also at ``genlm.bytes.byte_lm.trie_state``).

    ``WITH_EOS``: they end the sequence (a state's EOS mode). ``WITHOUT_EOS``: they count
    as the text they spell, as while prefilling.
    """

    WITH_EOS = "with_eos"
    WITHOUT_EOS = "without_eos"

    @classmethod
    def of(cls, eos_mode: bool) -> TrieMode:
        """``WITH_EOS`` if ``eos_mode``, else ``WITHOUT_EOS``."""
        return cls.WITH_EOS if eos_mode else cls.WITHOUT_EOS


def _as_numpy(ws: Any) -> np.ndarray:
    """A float64 array from numpy data, a torch tensor (any device and float dtype) or a
    list of rows that holds tensors, as genlm-bytes 0.2 took them.

    Tensors are widened by torch: numpy reads no bfloat16 and no device memory.

    Raises:
        TypeError: complex weights (the cast would drop their imaginary parts).
    """
    if is_torch(ws):
        check_real(ws)
        return ws.detach().double().cpu().numpy()
    if isinstance(ws, (list, tuple)) and any(is_torch(w) for w in ws):
        return np.stack([_as_numpy(w) for w in ws])
    ws = np.asarray(ws)
    check_real(ws)
    return ws.astype(np.float64, copy=False)


class EosModeTrie:
    """genlm-bytes 0.2's ``TokenByteTrie``: a token vocabulary's byte trie with per-node
    weight sums (in a :class:`TrieMode` chosen per call) and maxima, its EOS node last.

    Args:
        decode: ``decode[i]`` is token ``i``'s bytes (not empty).
        device: accepted for compatibility (``None``, ``"cpu"`` or ``"cuda"``); the trie
            always computes on the CPU.
        atomic_tokens: tokens (bytes) that are not spelled by their bytes; their weight
            counts nowhere (unless they are EOS tokens, in ``WITH_EOS`` mode).
        eot_token: accepted for compatibility; the end of a token is not a node here.
        eos_tokens: tokens (bytes) that end the sequence in ``WITH_EOS`` mode.
        max_batch_size: accepted for compatibility (rows are computed together anyway).
        atomic_byte_strings, eot_sentinel, eos_byte_strings: genlm-bytes 0.2.0's released
            names of ``atomic_tokens``, ``eot_token`` and ``eos_tokens`` (keywords only);
            give either name of each, or both equal.

    Each EOS and atomic byte string must be the bytes of some token: one that is not
    raises ``ValueError`` (an EOS string that spells no token would silently leave the
    trie without EOS), and so does an empty ``decode``, both names of an option given
    different values, an unknown device; an EOS or atomic option that is one byte string
    instead of a list, or holds something not bytes, raises ``TypeError``, and so does a
    ``decode`` entry that is not bytes (``bytes(3)`` would be three NUL bytes) or a
    ``decode`` that is one byte string (its items are ints), as genlm-core's trie does.

    Attributes:
        core: the :class:`genlm.core.TokenByteTrie` doing the work.
        root: the root node (0).
        eos_node: the EOS node, the last index (``num_nodes - 1``).
        num_nodes: nodes of the results, the EOS node included.

    Weights are rows of ``len(decode)`` token weights (probabilities): one row
    ``(len(decode),)`` for :meth:`weight_sum` and :meth:`weight_max`, a batch
    ``(B, len(decode))`` for the ``batch_`` methods; numpy or torch. Results are float64,
    one entry per node (``(num_nodes,)`` or ``(B, num_nodes)``). ``mode`` is
    ``TrieMode.WITHOUT_EOS`` (the default, also for None) or ``WITH_EOS``, or its value.
    Weights of the wrong shape (a batch given to ``weight_sum`` too), an unknown mode or an
    unknown device raise ``ValueError``.
    """

    def __init__(
        self,
        decode: Sequence[bytes],
        device: str | None = None,
        atomic_tokens: Sequence[bytes] | None = None,
        eot_token: bytes | None = None,
        eos_tokens: Sequence[bytes] | None = None,
        max_batch_size: int = 64,
        *,
        atomic_byte_strings: Sequence[bytes] | None = None,
        eot_sentinel: bytes | None = None,
        eos_byte_strings: Sequence[bytes] | None = None,
    ):
        if device not in (None, "cpu", "cuda"):
            raise ValueError(f"Invalid device: {device!r}. Must be 'cpu', 'cuda' or None")
        check_token_bytes(decode, "decode")
        self.decode = [bytes(t) for t in decode]
        if not self.decode:
            raise ValueError("the vocabulary (decode) is empty: a trie needs at least one token")
        self.device = "cpu"
        #: The end-of-token value (unused here); also ``eot_sentinel``, 0.2.0's name.
        self.eot_token = self.eot_sentinel = either_name(
            "eot_token", eot_token, "eot_sentinel", eot_sentinel
        )
        self.max_batch_size = max_batch_size
        #: The EOS byte strings; also ``eos_byte_strings``, 0.2.0's name (the same set).
        self.eos_tokens = self.eos_byte_strings = self._known(
            "EOS",
            either_byte_strings("eos_tokens", eos_tokens, "eos_byte_strings", eos_byte_strings),
        )
        self.eos_token_ids = [i for i, t in enumerate(self.decode) if t in self.eos_tokens]
        atomic = self._known(
            "atomic",
            either_byte_strings(
                "atomic_tokens", atomic_tokens, "atomic_byte_strings", atomic_byte_strings
            ),
        )
        self.core = CoreTrie(
            self.decode, atomic_ids=[i for i, t in enumerate(self.decode) if t in atomic]
        )
        self.root = self.core.root
        self.eos_node = self.core.num_nodes
        self.num_nodes = self.core.num_nodes + 1

    def _known(self, role: str, strings: set[bytes] | None) -> set[bytes]:
        """``strings`` (None: none), each checked to be the bytes of some token."""
        missing = sorted((strings or set()) - set(self.decode))
        if missing:
            raise ValueError(
                f"{role} byte string {missing[0]!r} is not the bytes of any token of the "
                "vocabulary (decode)"
            )
        return strings or set()

    @property
    def node2prefix(self) -> list[bytes]:
        """Each node's byte prefix (the EOS node's is empty)."""
        return [self.core.prefix(v) for v in range(self.core.num_nodes)] + [b""]

    def prepare(self, ws: Any, mode: TrieMode | None) -> tuple[np.ndarray, np.ndarray]:
        """``(w, eos)``: the rows as float64 ``(B, len(decode))`` for the core trie (the EOS
        tokens' columns zeroed in ``WITH_EOS`` mode), and each row's EOS weight ``(B,)``."""
        w = np.atleast_2d(_as_numpy(ws))
        if w.shape[1] != len(self.decode):
            raise ValueError(f"expected rows of {len(self.decode)} weights, got shape {w.shape}")
        with_eos = TrieMode(mode or TrieMode.WITHOUT_EOS) is TrieMode.WITH_EOS
        ids = np.array(self.eos_token_ids if with_eos else [], dtype=np.int64)
        return split_eos(w, ids, log=False)

    def finish(self, masses: np.ndarray, eos: np.ndarray) -> np.ndarray:
        """The core trie's sums with :meth:`prepare`'s EOS weight as the last column and
        added to the root's."""
        out = np.concatenate([np.atleast_2d(masses), eos[:, None]], axis=1)
        out[:, self.root] += eos
        return out

    def _row(self, ws: Any) -> np.ndarray:
        """One row of token weights as float64, shape ``(len(decode),)``: what
        :meth:`weight_sum` and :meth:`weight_max` (and the async trie's) take.

        Raises:
            ValueError: another shape; a batch ``(B, len(decode))`` among them (its rows
                after the first were dropped silently).
        """
        w = _as_numpy(ws)
        if w.shape != (len(self.decode),):
            raise ValueError(
                f"expected one row of weights of shape ({len(self.decode)},), got {w.shape} "
                "(a batch of rows goes to batch_weight_sum or batch_weight_max)"
            )
        return w

    def weight_sum(self, ws: Any, mode: TrieMode | None = None) -> np.ndarray:
        """Total weight of the tokens below each node; the EOS node (last) holds the EOS
        tokens' weight in ``WITH_EOS`` mode (0 otherwise), the root every token counted.
        ``ws`` is one row, shape ``(len(decode),)``."""
        return self.batch_weight_sum(self._row(ws)[None], mode)[0]

    def batch_weight_sum(self, ws: Any, mode: TrieMode | None = None) -> np.ndarray:
        """Row-wise :meth:`weight_sum`: ``(B, len(decode)) -> (B, num_nodes)``."""
        w, eos = self.prepare(ws, mode)
        return self.finish(self.core.batch_weight_sum(w), eos)

    def weight_max(self, ws: Any) -> np.ndarray:
        """Largest weight of the tokens below each node (-inf where none), ``WITHOUT_EOS``
        structure; the EOS node holds the largest EOS token weight. ``ws`` is one row, shape
        ``(len(decode),)``."""
        return self.batch_weight_max(self._row(ws)[None])[0]

    def batch_weight_max(self, ws: Any) -> np.ndarray:
        """Row-wise :meth:`weight_max`: ``(B, len(decode)) -> (B, num_nodes)``."""
        w = np.atleast_2d(_as_numpy(ws))
        return np.concatenate([self.core.batch_weight_max(w), self.eos_max(w)[:, None]], axis=1)

    def eos_max(self, w: np.ndarray) -> np.ndarray:
        """Each row's largest EOS token weight, ``(B,)`` (-inf without EOS tokens)."""
        if not self.eos_token_ids:
            return np.full(len(w), -np.inf)
        return w[:, self.eos_token_ids].max(axis=1)


class AsyncEosModeTrie:
    """genlm-bytes 0.2's ``AsyncTokenByteTrie``: :class:`EosModeTrie` computations awaited,
    concurrent calls batched (through genlm-core's ``AsyncTokenByteTrie`` and its scheduler).

    Args:
        trie: the trie to compute over.
    """

    def __init__(self, trie: EosModeTrie):
        self.trie = trie
        self._async: CoreAsyncTrie | None = None

    @classmethod
    def from_vocab(cls, vocab: Sequence[bytes], **kwargs: Any) -> AsyncEosModeTrie:
        """``AsyncEosModeTrie(EosModeTrie(vocab, **kwargs))``; the worker starts on first use."""
        return cls(EosModeTrie(vocab, **kwargs))

    def start(self) -> None:
        """Make the batching worker (also done by the first call)."""
        if self._async is None:
            self._async = CoreAsyncTrie(self.trie.core, max_batch_size=self.trie.max_batch_size)

    async def weight_sum(self, ws: Any, mode: TrieMode | None = None) -> np.ndarray:
        """:meth:`EosModeTrie.weight_sum`, batched with concurrent calls."""
        w, eos = self.trie.prepare(self.trie._row(ws), mode)
        self.start()
        return self.trie.finish(await self._async.weight_sum(w[0]), eos)[0]

    async def weight_max(self, ws: Any) -> np.ndarray:
        """:meth:`EosModeTrie.weight_max`, batched with concurrent calls."""
        w = self.trie._row(ws)
        self.start()
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


TokenByteTrie = EosModeTrie
"""genlm-bytes 0.2's published name of :class:`EosModeTrie` (not
:class:`genlm.core.TokenByteTrie`, which it wraps)."""

AsyncTokenByteTrie = AsyncEosModeTrie
"""genlm-bytes 0.2's published name of :class:`AsyncEosModeTrie` (not
:class:`genlm.core.AsyncTokenByteTrie`, which it wraps)."""
