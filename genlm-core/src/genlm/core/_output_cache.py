"""An LRU cache of next-token log-probabilities, bounded in bytes.

Keys are whole contexts plus whatever else changes the result (the active adapter),
so a hit is always exact. Values are stored read-only and returned without copying:
a caller that wants to modify a result copies it first.

The byte budget, eviction, duplicate, shared-block and locking rules are
:class:`~genlm.core.backend.ByteLRU`'s: each entry counts its array's bytes plus its key's
:func:`~genlm.core.backend.key_nbytes`. The rows of a computed batch are views of it
(:class:`~genlm.core.backend.BatchRows`: no copy per row), so a batch counts once, in full,
while any of its rows is held; rows reused after the rest of their batch was evicted
become copies of their own then (the shared-block rule).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from genlm.core._lru import Block, ByteLRU, key_nbytes
from genlm.core._rows import BatchRows, compact_row

__all__ = ["OutputCache"]


class OutputCache(ByteLRU[Hashable, np.ndarray]):
    """Least-recently-used map from a hashable key to a numpy array, bounded in bytes.

    Thread-safe: the event loop and the model's worker thread both use it.

    Args:
        max_bytes: budget for the stored arrays' ``nbytes`` plus their keys'
            :func:`key_nbytes`; 0 disables caching.

    Raises:
        ValueError: a negative ``max_bytes``.
    """

    def __init__(self, max_bytes: int = 256 * 2**20):
        super().__init__(max_bytes, detach=compact_row)

    def put(self, key: Hashable, value: np.ndarray) -> np.ndarray:
        """Make ``value`` read-only and hold it for ``key``, evicting the least recently used.

        Args:
            key: what identifies the result (context and variant).
            value: the array; its ``writeable`` flag is cleared in place. A torch row (see
                ``output="torch"``) is stored as it is: torch has no read-only flag.

        Returns:
            The array now held for ``key``: the one already held if any (a second put of a
            key keeps the first, counted once), else ``value``, which is also returned
            unheld when it and its key exceed the whole budget.
        """
        return self.put_many((key,), (value,))[0]

    def put_many(self, keys: Sequence[Hashable], values: Sequence[np.ndarray]) -> list[np.ndarray]:
        """:meth:`put` each ``values[i]`` for ``keys[i]`` under one hold of the lock (a
        batch's rows); what each ``put`` returns.

        ``values`` may be :class:`~genlm.core.backend.BatchRows`, the views of one batch
        (read-only already): they share its memory as one block. Those of a batch that
        started before the last :meth:`clear` (an older ``generation``) are returned
        unheld.
        """
        if not isinstance(values, BatchRows):
            for value in values:
                if isinstance(value, np.ndarray):
                    value.setflags(write=False)  # a no-op when it already is
            return self.add_many(
                (key, value, value.nbytes + key_nbytes(key)) for key, value in zip(keys, values)
            )
        covers = values[0].nbytes if values else 0
        costs = [covers + key_nbytes(key) for key in keys]
        block = Block(values.batch.nbytes, covers)
        # A batch records the generation when it starts computing (BatchRows.generation):
        # rows of a batch that started before the latest clear are not stored.
        return self.add_many(zip(keys, values, costs), block, values.generation)
