"""Where EOS mass comes from: the weight of the token ids that end the sequence.

Both the byte model (:meth:`ByteModel.masked_ids` decides the ids per EOS mode) and the
published 0.2 trie (``genlm.bytes.trie``, in ``WITH_EOS`` mode) take the EOS ids' weight out
of a row here; ``_device.masked_log_masses`` is this function's torch twin for log rows
on a device.
"""

from __future__ import annotations

import numpy as np


def split_eos(rows: np.ndarray, eos_ids: np.ndarray, log: bool) -> tuple[np.ndarray, np.ndarray]:
    """Move the weight of ``eos_ids`` out of ``rows`` into a total of its own.

    Args:
        rows: token weights, shape ``(..., V)``, float64; never written into.
        eos_ids: the ids that end the sequence.
        log: whether ``rows`` holds log-weights (then totals are ``logsumexp``s).

    Returns:
        ``(rest, eos)``: ``rows`` with the ``eos_ids`` columns at 0 (-inf in log space;
        ``rows`` itself when there are none), and each row's EOS total, shape ``(...)``.
    """
    if not len(eos_ids):
        return rows, np.full(rows.shape[:-1], -np.inf if log else 0.0)
    picked = rows[..., eos_ids]
    eos = np.logaddexp.reduce(picked, axis=-1) if log else picked.sum(axis=-1)
    rest = rows.copy()
    rest[..., eos_ids] = -np.inf if log else 0.0
    return rest, eos
