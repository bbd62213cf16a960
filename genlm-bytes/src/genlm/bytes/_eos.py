"""Where EOS mass comes from: the weight of the token ids that end the sequence.

Both the byte model (:meth:`ByteModel.masked_ids` decides the ids per EOS mode) and the
published 0.2 trie (``genlm.bytes.trie``, in ``WITH_EOS`` mode) take the EOS ids' weight out
of a row here; ``_device.masked_log_masses`` is this function's torch twin for log rows
on a device.
"""

from __future__ import annotations

import numpy as np


def split_eos(rows: np.ndarray, eos_ids: np.ndarray, log: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(rest, eos)``: ``rows`` (``(..., V)``, float64, never written into) with the
    ``eos_ids`` columns at 0 (-inf for ``log`` weights; ``rows`` itself when there are
    none), and each row's total of those columns (a ``logsumexp`` for ``log``)."""
    if not len(eos_ids):
        return rows, np.full(rows.shape[:-1], -np.inf if log else 0.0)
    picked = rows[..., eos_ids]
    eos = np.logaddexp.reduce(picked, axis=-1) if log else picked.sum(axis=-1)
    rest = rows.copy()
    rest[..., eos_ids] = -np.inf if log else 0.0
    return rest, eos
