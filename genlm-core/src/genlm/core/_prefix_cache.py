"""A trie of token-id prefixes holding per-prefix state (a backend's KV cache).

Backends that can resume a forward pass from a cached prefix store their state here:
``longest_prefix`` finds the deepest cached prefix of a new context, so only the new
tokens need computing. Entries are LRU-evicted to stay within a byte budget; pinned
entries (a shared prompt) are never evicted. All walks are iterative, so a chain of
100,000 tokens is fine.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Generic, TypeVar

import attrs

from genlm.core._lru import ByteLRU
from genlm.core._validation import checked_count

V = TypeVar("V")


@attrs.define(eq=False, slots=True)
class _Node:
    """One token of a stored prefix; ``has_value`` mirrors whether the LRU holds it."""

    parent: _Node | None
    token: int
    depth: int
    children: dict[int, _Node] = attrs.field(factory=dict)
    has_value: bool = False


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
    memory for KV). The trie's own nodes (about 340 bytes of host memory per token of a
    distinct prefix on CPython 3.11) are not: they are a different memory, and a node
    lives exactly as long as an entry at or below it, so they are bounded by the held
    entries' tokens. A caller that wants them in the budget adds them to its sizes.

    Args:
        max_bytes: budget for the sizes given to :meth:`insert`; pinned entries count
            towards it but are never evicted.

    Raises:
        ValueError: ``max_bytes`` is negative.

    The entries live in a :class:`~genlm.core.backend.ByteLRU` (keyed by trie node), so byte
    accounting, LRU order, pins, the duplicate rule and the lock are every cache's.
    Thread-safe; in practice only the model's worker thread touches it.
    """

    def __init__(self, max_bytes: int):
        self._root = _Node(None, -1, 0)
        #: The entries (trie node -> value): byte accounting, LRU order, pins and the lock.
        self._lru: ByteLRU[_Node, V] = ByteLRU(max_bytes, on_evict=self._forget)

    def __len__(self) -> int:
        """Number of stored entries."""
        return len(self._lru)

    @property
    def max_bytes(self) -> int:
        """The budget for the sizes given to :meth:`insert`."""
        return self._lru.max_bytes

    @property
    def nbytes(self) -> int:
        """The sum of the sizes of the stored entries, pinned ones included."""
        return self._lru.nbytes

    def _find(self, tokens: Sequence[int]) -> _Node | None:
        node = self._root
        for t in tokens:
            node = node.children.get(t)
            if node is None:
                return None
        return node

    def _entry(self, tokens: Sequence[int]) -> _Node | None:
        """The node of the entry stored for exactly ``tokens``, or None."""
        node = self._find(tokens)
        return node if node is not None and node.has_value else None

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
        with self._lru.lock:
            node, best = self._root, None
            for i in range(limit):
                node = node.children.get(tokens[i])
                if node is None:
                    break
                if node.has_value:
                    best = node
            if best is None:
                return PrefixHit(0, None)
            return PrefixHit(best.depth, self._lru.get(best))

    def get(self, tokens: Sequence[int]) -> V | None:
        """The entry stored for exactly ``tokens``, marked most recently used.

        Args:
            tokens: the prefix.

        Returns:
            Its value, or None when nothing is stored for exactly these tokens.
        """
        with self._lru.lock:
            node = self._entry(tokens)
            return None if node is None else self._lru.get(node)

    def __contains__(self, tokens: Sequence[int]) -> bool:
        return self._entry(tokens) is not None

    def is_pinned(self, tokens: Sequence[int]) -> bool:
        """Whether an entry is stored for exactly ``tokens`` and pinned."""
        with self._lru.lock:
            node = self._entry(tokens)
            return node is not None and self._lru.is_pinned(node)

    def insert(self, tokens: Sequence[int], value: V, nbytes: int, pin: bool = False) -> bool:
        """Store ``value`` (of size ``nbytes``) for prefix ``tokens``; evict to fit.

        An entry already stored for ``tokens`` is kept (and marked most recently used):
        ``value`` is dropped, as for every GenLM cache (see
        :class:`~genlm.core.backend.ByteLRU`). Least recently used unpinned entries are
        evicted until the total fits ``max_bytes``.

        Args:
            tokens: the prefix (non-empty).
            value: the state to keep for it.
            nbytes: what the entry costs against the budget.
            pin: also :meth:`pin` the entry stored for ``tokens``.

        Returns:
            Whether an entry is stored for ``tokens`` now: False, storing nothing, when the
            new entry alone exceeds the budget or pinned entries leave no room for it.

        Raises:
            ValueError: ``tokens`` is empty, or ``nbytes`` is negative.
            TypeError: ``nbytes`` or a token is not an integer (nothing is stored).
        """
        if not tokens:
            raise ValueError("cannot cache the empty prefix")
        nbytes = checked_count("nbytes", nbytes, 0)  # before the trie changes
        with self._lru.lock:
            node = self._root
            try:
                for t in tokens:
                    child = node.children.get(t)
                    if child is None:
                        # Keyed by the int, as _forget deletes it (numpy ints are taken).
                        token = operator.index(t)
                        child = node.children[token] = _Node(node, token, node.depth + 1)
                    node = child
            except TypeError:
                self._prune(node)  # the nodes this walk made hold nothing
                raise TypeError(f"tokens must be integers, got {t!r} in {tokens!r}") from None
            node.has_value = True
            self._lru.add(node, value, nbytes, pin=pin)
            if node.has_value and node not in self._lru:  # too large: never held
                self._forget(node)
            return node.has_value

    def pin(self, tokens: Sequence[int]) -> None:
        """Protect the entry for ``tokens`` from eviction (counted: pin twice, unpin twice).

        Args:
            tokens: the prefix of a stored entry.

        Raises:
            KeyError: nothing is stored for exactly these tokens.
        """
        with self._lru.lock:
            node = self._entry(tokens)
            if node is None:
                raise KeyError(f"no cached entry for a prefix of {len(tokens)} tokens")
            self._lru.pin(node)

    def unpin(self, tokens: Sequence[int]) -> None:
        """Undo one :meth:`pin`; the entry becomes evictable when no pins remain.

        Args:
            tokens: the prefix of a pinned entry.

        Raises:
            KeyError: no pinned entry is stored for exactly these tokens.
        """
        with self._lru.lock:
            node = self._entry(tokens)
            try:
                self._lru.unpin(node)
            except KeyError:
                raise KeyError(f"no pinned entry for a prefix of {len(tokens)} tokens") from None

    def remove(self, tokens: Sequence[int]) -> bool:
        """Drop the entry for exactly ``tokens``, pinned or not.

        Args:
            tokens: the prefix.

        Returns:
            Whether an entry existed.
        """
        with self._lru.lock:
            node = self._entry(tokens)
            if node is None:
                return False
            self._lru.pop(node)
            self._forget(node)
            return True

    def remove_below(self, tokens: Sequence[int]) -> int:
        """Drop every entry whose prefix starts with ``tokens`` (the entry for exactly
        ``tokens`` included), pinned or not: a backend forgets one variant's state (the hf
        backend keys KV by ``(variant marker, *context)``).

        Returns:
            How many entries were dropped.
        """
        with self._lru.lock:
            top = self._find(tokens)
            if top is None:
                return 0
            found, stack = [], [top]
            while stack:  # iterative: chains may be long
                node = stack.pop()
                if node.has_value:
                    found.append(node)
                stack.extend(node.children.values())
            for node in reversed(found):  # deepest first: _forget prunes emptied branches
                self._lru.pop(node)
                self._forget(node)
            return len(found)

    def clear(self, keep_pinned: bool = False) -> None:
        """Drop every entry.

        Args:
            keep_pinned: drop only the unpinned entries.
        """
        with self._lru.lock:
            if keep_pinned:
                for node in self._lru.evictable():
                    self._lru.pop(node)
                    self._forget(node)
                return
            self._root = _Node(None, -1, 0)
            self._lru.clear()

    def _forget(self, node: _Node, value: object = None) -> None:
        """Mark ``node`` empty and prune its branch upward while nodes hold nothing.

        Also the LRU's ``on_evict`` callback (``value`` is the evicted state, unused).
        Iterative, so a 100,000-token chain is fine.
        """
        node.has_value = False
        self._prune(node)

    @staticmethod
    def _prune(node: _Node) -> None:
        """Remove ``node`` and its ancestors while they hold nothing."""
        while node.parent is not None and not node.children and not node.has_value:
            del node.parent.children[node.token]
            node = node.parent
