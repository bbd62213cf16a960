"""A trie of token-id prefixes holding per-prefix state (a backend's KV cache).

Backends that can resume a forward pass from a cached prefix store their state here:
``longest_prefix`` finds the deepest cached prefix of a new context, so only the new
tokens need computing. Entries are LRU-evicted to stay within a byte budget; pinned
entries (a shared prompt) are never evicted. All walks are iterative, so a chain of
100,000 tokens is fine.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import attrs

V = TypeVar("V")


@attrs.define(eq=False, slots=True)
class _Node:
    parent: _Node | None
    token: int
    depth: int
    children: dict[int, _Node] = attrs.field(factory=dict)
    value: Any = None
    nbytes: int = 0
    has_value: bool = False
    pins: int = 0


@attrs.frozen
class PrefixHit(Generic[V]):
    """The result of a lookup: how many leading tokens are cached, and their state.

    Attributes:
        length: the number of leading tokens of the query the entry covers (0 on a miss).
        value: the state stored for those tokens, or None on a miss.
    """

    length: int
    value: V | None


class PrefixCache(Generic[V]):
    """Token-prefix trie with LRU eviction bounded in bytes.

    Backends keep per-prefix state here (the hf backend's KV, each entry holding only
    what its tokens added over its parent's), so a request resumes from its longest
    cached prefix. Sizes are whatever the caller says an entry costs.

    What is counted: the sizes callers declare, i.e. the backend state (usually device
    memory for KV). The trie's own nodes (about 370 bytes of host memory per token of a
    distinct prefix on CPython 3.11) are not: they are a different memory, and a node
    lives exactly as long as an entry at or below it, so they are bounded by the held
    entries' tokens. A caller that wants them in the budget adds them to its sizes.

    Args:
        max_bytes: budget for the sizes given to :meth:`insert`; pinned entries count
            towards it but are never evicted.

    Raises:
        ValueError: ``max_bytes`` is negative.

    Thread-safe; in practice only the model's worker thread touches it.
    """

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._root = _Node(None, -1, 0)
        self._lru: OrderedDict[_Node, None] = OrderedDict()  # unpinned entries, oldest first
        self._entries = 0
        self._bytes = 0
        self._lock = threading.RLock()

    def __len__(self) -> int:
        """Number of stored entries."""
        return self._entries

    @property
    def nbytes(self) -> int:
        """The sum of the sizes of the stored entries, pinned ones included."""
        return self._bytes

    def _find(self, tokens: Sequence[int]) -> _Node | None:
        node = self._root
        for t in tokens:
            node = node.children.get(t)
            if node is None:
                return None
        return node

    def longest_prefix(self, tokens: Sequence[int], max_length: int | None = None) -> PrefixHit[V]:
        """The deepest stored entry whose prefix is ``tokens[:n]``, ``n <= max_length``.

        Marks the entry most recently used.

        Args:
            tokens: the query context.
            max_length: consider prefixes of at most this many tokens (e.g.
                ``len(tokens) - 1`` to keep one token to run); None for all.

        Returns:
            The hit, or ``PrefixHit(0, None)`` when no prefix is stored.
        """
        limit = len(tokens) if max_length is None else min(max_length, len(tokens))
        with self._lock:
            node, best = self._root, None
            for i in range(limit):
                node = node.children.get(tokens[i])
                if node is None:
                    break
                if node.has_value:
                    best = node
            if best is None:
                return PrefixHit(0, None)
            if best in self._lru:
                self._lru.move_to_end(best)
            return PrefixHit(best.depth, best.value)

    def get(self, tokens: Sequence[int]) -> V | None:
        """The entry stored for exactly ``tokens``, marked most recently used.

        Args:
            tokens: the prefix.

        Returns:
            Its value, or None when nothing is stored for exactly these tokens.
        """
        with self._lock:
            node = self._find(tokens)
            if node is None or not node.has_value:
                return None
            if node in self._lru:
                self._lru.move_to_end(node)
            return node.value

    def __contains__(self, tokens: Sequence[int]) -> bool:
        node = self._find(tokens)
        return node is not None and node.has_value

    def insert(self, tokens: Sequence[int], value: V, nbytes: int, pin: bool = False) -> bool:
        """Store ``value`` (of size ``nbytes``) for prefix ``tokens``; evict to fit.

        Replaces an existing entry; least recently used unpinned entries are evicted
        until the total fits ``max_bytes``.

        Args:
            tokens: the prefix (non-empty).
            value: the state to keep for it.
            nbytes: what the entry costs against the budget.
            pin: also :meth:`pin` it (protect it from eviction).

        Returns:
            True when stored; False, storing nothing, when the entry alone exceeds the
            budget (an entry already stored for ``tokens`` then stays), or when pinned
            entries leave no room for it.

        Raises:
            ValueError: ``tokens`` is empty.
        """
        if not tokens:
            raise ValueError("cannot cache the empty prefix")
        if nbytes > self.max_bytes:
            return False
        with self._lock:
            node = self._root
            for t in tokens:
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = _Node(node, int(t), node.depth + 1)
                node = child
            if node.has_value:
                self._bytes -= node.nbytes
            else:
                self._entries += 1
            node.value, node.nbytes, node.has_value = value, nbytes, True
            self._bytes += nbytes
            if pin:
                node.pins += 1
            if node.pins:
                self._lru.pop(node, None)
            else:
                self._lru[node] = None
                self._lru.move_to_end(node)
            self._evict()
            return node.has_value

    def pin(self, tokens: Sequence[int]) -> None:
        """Protect the entry for ``tokens`` from eviction (counted: pin twice, unpin twice).

        Args:
            tokens: the prefix of a stored entry.

        Raises:
            KeyError: nothing is stored for exactly these tokens.
        """
        with self._lock:
            node = self._find(tokens)
            if node is None or not node.has_value:
                raise KeyError(f"no cached entry for a prefix of {len(tokens)} tokens")
            node.pins += 1
            self._lru.pop(node, None)

    def unpin(self, tokens: Sequence[int]) -> None:
        """Undo one :meth:`pin`; the entry becomes evictable when no pins remain.

        Args:
            tokens: the prefix of a pinned entry.

        Raises:
            KeyError: no pinned entry is stored for exactly these tokens.
        """
        with self._lock:
            node = self._find(tokens)
            if node is None or not node.has_value or node.pins == 0:
                raise KeyError(f"no pinned entry for a prefix of {len(tokens)} tokens")
            node.pins -= 1
            if node.pins == 0:
                self._lru[node] = None
            self._evict()

    def remove(self, tokens: Sequence[int]) -> bool:
        """Drop the entry for exactly ``tokens``, pinned or not.

        Args:
            tokens: the prefix.

        Returns:
            Whether an entry existed.
        """
        with self._lock:
            node = self._find(tokens)
            if node is None or not node.has_value:
                return False
            self._drop(node)
            return True

    def clear(self, keep_pinned: bool = False) -> None:
        """Drop every entry.

        Args:
            keep_pinned: drop only the unpinned entries.
        """
        with self._lock:
            if keep_pinned:
                while self._lru:
                    self._drop(next(iter(self._lru)))
                return
            self._root = _Node(None, -1, 0)
            self._lru.clear()
            self._entries = 0
            self._bytes = 0

    def _evict(self) -> None:
        while self._bytes > self.max_bytes and self._lru:
            self._drop(next(iter(self._lru)))

    def _drop(self, node: _Node) -> None:
        self._lru.pop(node, None)
        self._bytes -= node.nbytes
        self._entries -= 1
        node.value, node.nbytes, node.has_value, node.pins = None, 0, False, 0
        # Prune the branch upward while nodes hold nothing (iteratively).
        while node.parent is not None and not node.children and not node.has_value:
            del node.parent.children[node.token]
            node = node.parent
