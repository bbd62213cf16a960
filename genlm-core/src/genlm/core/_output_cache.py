"""An LRU cache of next-token log-probabilities, bounded in bytes.

Keys are whole contexts plus whatever else changes the result (the active adapter),
so a hit is always exact. Values are stored read-only and returned without copying:
a caller that wants to modify a result copies it first.

The budget counts each entry's array bytes plus an estimate of its key's
(:func:`key_nbytes`): a 300-token context is about 10.9 KB of Python objects, more than
a float32 row of a 2,000-token vocabulary.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

#: What one token id costs in a key: a CPython int below 2**30.
_ITEM_BYTES = sys.getsizeof(2**20)


def key_nbytes(key: Hashable) -> int:
    """Estimated bytes held by a cache key; :class:`OutputCache` counts it with the array.

    ``sys.getsizeof`` of the key; for a tuple, plus that of each part; for a tuple part
    (a model's token ids), plus 28 bytes (one int) per item. This is exact for a
    ``(variant, token ids)`` key whose ids are distinct objects and an upper bound when
    keys share int objects, and it costs no walk over the ids.
    """
    size = sys.getsizeof(key)
    if type(key) is tuple:
        for part in key:
            size += sys.getsizeof(part)
            if type(part) is tuple:
                size += _ITEM_BYTES * len(part)
    return size


class OutputCache:
    """Least-recently-used map from a hashable key to a numpy array, bounded in bytes.

    Thread-safe: the event loop and the model's worker thread both use it.

    Args:
        max_bytes: budget for the stored arrays' ``nbytes`` plus their keys'
            :func:`key_nbytes`; 0 disables caching.

    Raises:
        ValueError: a negative ``max_bytes``.
    """

    def __init__(self, max_bytes: int = 256 * 2**20):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        #: key -> (stored array, the bytes counted for the entry), oldest first.
        self._data: OrderedDict[Hashable, tuple[np.ndarray, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def nbytes(self) -> int:
        """Bytes currently counted: arrays plus estimated key bytes of the held entries."""
        return self._bytes

    def get(self, key: Hashable) -> np.ndarray | None:
        """The cached array for ``key``, marked most recently used.

        Args:
            key: what identifies the result (context and variant).

        Returns:
            The read-only array, or None on a miss.
        """
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: Hashable, value: np.ndarray) -> np.ndarray:
        """Store ``value`` (made read-only) and evict the least recently used to fit.

        Args:
            key: what identifies the result.
            value: the array; its ``writeable`` flag is cleared in place.

        Returns:
            ``value``, now read-only. An entry (array and key) larger than the whole
            budget is returned without being stored (an entry already stored for ``key``
            then stays). Storing a key again replaces its entry (counted once). A torch
            row (see ``genlm.core._rows``) is stored as it is: torch has no read-only flag.
        """
        if isinstance(value, np.ndarray) and value.flags.writeable:
            value.setflags(write=False)
        size = value.nbytes + key_nbytes(key)
        if size > self.max_bytes:
            return value
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._data[key] = (value, size)
            self._bytes += size
            self._evict_to_fit()
        return value

    def resize(self, max_bytes: int) -> None:
        """Set the budget to ``max_bytes``, evicting the least recently used entries to fit.

        For a budget known only once the model is loaded (the genlm-backend facade sizes
        the cache in rows, whose width is the vocabulary's).

        Args:
            max_bytes: the new budget; 0 disables caching.

        Raises:
            ValueError: a negative ``max_bytes``.
        """
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        with self._lock:
            self.max_bytes = max_bytes
            self._evict_to_fit()

    def _evict_to_fit(self) -> None:
        """Drop least recently used entries until the budget holds (caller holds the lock)."""
        while self._bytes > self.max_bytes:
            _, (_, evicted) = self._data.popitem(last=False)
            self._bytes -= evicted

    def clear(self) -> None:
        """Drop every entry (the hit and miss counters are kept)."""
        with self._lock:
            self._data.clear()
            self._bytes = 0
