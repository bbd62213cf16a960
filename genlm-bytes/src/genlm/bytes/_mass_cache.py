"""``MassCache``: each token context's :class:`NextTokens`, LRU, bounded in bytes."""

from __future__ import annotations

from genlm.bytes._types import NextTokens
from genlm.core.backend import ByteLRU, checked_count, key_nbytes

#: A cache key: the token context and the EOS mode its masses were computed in.
Key = tuple[tuple[int, ...], bool]


def entry_bytes(key: Key, value: NextTokens) -> int:
    """Bytes one entry holds: its arrays (an array shared by two fields counted once) and
    its key (core's one rule for context keys, ``genlm.core.backend.key_nbytes``)."""
    arrays = {id(a): a.nbytes for a in (value.lm_row, value.logp, value.mass)}
    return sum(arrays.values()) + key_nbytes(key)


class MassCache(ByteLRU[Key, NextTokens]):
    """Least-recently-used :class:`NextTokens` by ``(context, eos_mode)``, at most
    ``max_bytes`` in all (by :func:`entry_bytes`).

    Core's byte-bounded LRU (``genlm.core.backend.ByteLRU``) with its rules: :attr:`used_bytes`
    is the sum of :func:`entry_bytes` over the held entries, and two concurrent misses of
    one context both compute its masses, the second :meth:`put` keeping the entry already
    held (same values) and counting nothing.
    """

    def __init__(self, max_bytes: int):
        super().__init__(checked_count("cache_bytes", max_bytes, 0, whole_floats=True))

    @property
    def used_bytes(self) -> int:
        """Bytes held now (see :func:`entry_bytes`)."""
        return self.nbytes

    def put(self, key: Key, value: NextTokens, generation: int | None = None) -> NextTokens:
        """Hold ``value`` under ``key`` (evicting the least recently used entries to fit)
        and return the entry now held for ``key``: the one already there if any, else
        ``value`` (also returned, unheld, when it alone exceeds ``max_bytes``, or when
        ``generation``, read before its row was asked for, is older than :attr:`generation`:
        a :meth:`clear` came since)."""
        return self.add(key, value, entry_bytes(key, value), generation=generation)
