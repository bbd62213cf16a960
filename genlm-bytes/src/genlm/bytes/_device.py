"""Next-token masses kept on the token LM's device (imported only for torch rows).

When the LM hands rows as torch tensors on a GPU (``HFLM.device_rows``), copying each row
(V floats) and its trie masses (one per node) to the host per context would dominate a byte
step. Here the row is masked and reduced by the trie's torch kernel where it lies (float64,
as on the host), and the results stay there as :class:`DeviceVector` objects: the beam reads a
candidate's few entries (a node's mass, a token's log-probability, a node's children for
the next-byte distribution), and only those entries cross to the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class DeviceVector:
    """A read-only float64 vector that stays on its torch device.

    Indexing copies only the indexed entries to the host: an integer gives a Python float, a
    slice or an integer array a float64 numpy array, so the beam reads it as it reads a numpy
    row. ``np.asarray(v)`` copies the whole vector.
    """

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)):
            return self.tensor[int(index)].item()
        if not isinstance(index, slice):
            index = torch.as_tensor(np.asarray(index, dtype=np.int64), device=self.tensor.device)
        return self.tensor[index].cpu().numpy()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self.tensor.cpu().numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def __len__(self) -> int:
        return self.tensor.shape[0]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def __repr__(self) -> str:
        return f"DeviceVector({len(self)} float64 on {self.tensor.device})"


def masked_log_masses(
    trie: Any, row: torch.Tensor, masked: np.ndarray
) -> tuple[DeviceVector, DeviceVector, float]:
    """The device twin of ``ByteModel._masses``' host path, for a torch row.

    Returns ``(logp, mass, log_eos)``: the row in float64 with the ``masked`` ids at -inf,
    the trie's log masses of it (torch kernel, float64, on the row's device) and the log of
    the masked ids' total probability (-inf when none are masked), the only value read back.
    """
    lp = row.detach().to(torch.float64)
    log_eos = -np.inf
    if len(masked):
        if row.dtype == torch.float64:  # ``to`` did not copy: never write into the LM's row
            lp = lp.clone()
        ids = torch.as_tensor(masked, device=lp.device)
        log_eos = torch.logsumexp(lp[ids], 0).item()
        lp[ids] = -torch.inf
    return DeviceVector(lp), DeviceVector(trie.log_weight_sum(lp)), log_eos
