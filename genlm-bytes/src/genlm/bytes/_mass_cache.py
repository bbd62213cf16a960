"""``MassCache``: each token context's :class:`NextTokens`, LRU, bounded in bytes."""

from __future__ import annotations

from collections import OrderedDict

from genlm.bytes._types import NextTokens

#: A cache key: the token context and the EOS mode its masses were computed in.
Key = tuple[tuple[int, ...], bool]


def entry_bytes(key: Key, value: NextTokens) -> int:
    """Bytes one entry holds: its arrays (an array shared by two fields counted once) and
    its key's token ids (8 bytes each)."""
    arrays = {id(a): a.nbytes for a in (value.lm_row, value.logp, value.mass)}
    return sum(arrays.values()) + 8 * len(key[0])


class MassCache:
    """Least-recently-used :class:`NextTokens` by ``(context, eos_mode)``, at most
    ``max_bytes`` in all (by :func:`entry_bytes`).

    Invariant: :attr:`used_bytes` is the sum of :func:`entry_bytes` over the held entries.
    Two concurrent misses of one context both compute its masses; the second
    :meth:`put` keeps the entry already held (same values) and counts nothing.
    """

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Key, NextTokens] = OrderedDict()
        self._used = 0

    @property
    def used_bytes(self) -> int:
        """Bytes held now (see :func:`entry_bytes`)."""
        return self._used

    def get(self, key: Key, *, touch: bool = True) -> NextTokens | None:
        """The entry of ``key`` or None; ``touch`` marks it most recently used."""
        hit = self._entries.get(key)
        if hit is not None and touch:
            self._entries.move_to_end(key)
        return hit

    def __contains__(self, key: Key) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[Key, NextTokens]]:
        """The held entries, least recently used first."""
        return list(self._entries.items())

    def put(self, key: Key, value: NextTokens) -> NextTokens:
        """Hold ``value`` under ``key`` (evicting the least recently used entries to fit)
        and return the entry now held for ``key``: the one already there if any, else
        ``value`` (also returned, unheld, when it alone exceeds ``max_bytes``)."""
        held = self.get(key)
        if held is not None:
            return held
        size = entry_bytes(key, value)
        if size > self.max_bytes:
            return value
        self._entries[key] = value
        self._used += size
        while self._used > self.max_bytes:
            old_key, old = self._entries.popitem(last=False)
            self._used -= entry_bytes(old_key, old)
        return value

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()
        self._used = 0
