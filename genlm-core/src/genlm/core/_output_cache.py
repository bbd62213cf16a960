"""An LRU cache of next-token log-probabilities, bounded in bytes.

Keys are whole contexts plus whatever else changes the result (the active adapter),
so a hit is always exact. Values are stored read-only and returned without copying:
a caller that wants to modify a result copies it first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np


class OutputCache:
    """Least-recently-used map from a hashable key to a numpy array, bounded in bytes.

    Thread-safe: the event loop and the model's worker thread both use it.

    Args:
        max_bytes: total ``nbytes`` of stored arrays; 0 disables caching.
    """

    def __init__(self, max_bytes: int = 256 * 2**20):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._data: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def nbytes(self) -> int:
        """Bytes currently held."""
        return self._bytes

    def get(self, key: Hashable) -> np.ndarray | None:
        """The cached array for ``key``, marked most recently used, or None."""
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Hashable, value: np.ndarray) -> np.ndarray:
        """Store ``value`` (made read-only) and evict the least recently used to fit.

        Returns the stored array. A value larger than the whole budget is not stored. A torch
        row (see ``genlm.core._rows``) is stored as it is: torch has no read-only flag.
        """
        if isinstance(value, np.ndarray) and value.flags.writeable:
            value.setflags(write=False)
        size = value.nbytes
        if size > self.max_bytes:
            return value
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._data[key] = value
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._data.popitem(last=False)
                self._bytes -= evicted.nbytes
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0
