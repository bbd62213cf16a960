"""Rows in the form the caller asked for: numpy arrays, or torch tensors kept on their device.

A backend's ``_logprobs_batch`` may return a numpy array or a torch tensor (e.g. rows left on
the GPU). Core keeps each row in the form it came in (the output cache holds it as is) and
converts only at the edge, in :func:`as_output` and :func:`stack_output`, for the form the
caller asked for with ``output=``. torch is imported only when a caller asks for torch rows or
a backend hands torch rows in, so genlm-core stays torch-free.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from genlm.core._errors import BackendError

#: What ``output=`` accepts: ``"numpy"`` (float32 arrays on the host, read-only when shared
#: with the cache) or ``"torch"`` (float32 tensors on the device the backend computed them on).
Output = Literal["numpy", "torch"]

OUTPUTS = ("numpy", "torch")


def check_output(output: str) -> None:
    """Raise ``ValueError`` unless ``output`` is one of :data:`OUTPUTS`, and
    ``ModuleNotFoundError`` for ``"torch"`` where torch is not installed (before any work,
    rather than a bare import error once the rows are computed)."""
    if output not in OUTPUTS:
        raise ValueError(f"output must be 'numpy' or 'torch', got {output!r}")
    if output == "torch" and importlib.util.find_spec("torch") is None:
        raise ModuleNotFoundError(
            "output='torch' needs torch, which is not installed here (pip install torch); "
            "output='numpy' needs nothing more",
            name="torch",
        )


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor, without importing torch when nobody has.

    Args:
        x: any object (a backend's row, a caller's weights).

    Returns:
        True for a ``torch.Tensor``; False for anything else, and always while torch is
        not imported (no tensor can exist then). While another thread is importing torch,
        ``sys.modules`` holds the half-made module, without ``Tensor`` yet: no tensor can
        exist then either (a batch finishing on the worker meanwhile must not fail).
    """
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    return tensor is not None and isinstance(x, tensor)


def check_real(weights: Any) -> None:
    """Raise TypeError for complex weights: an array or a tensor of a complex dtype.

    Casting weights to float64 (numpy's ``astype``, torch's ``.double()``) drops the
    imaginary parts, with at most a warning, so every reader of caller-given weights
    checks before it casts. A list of complex rows or numbers is complex only once
    converted: check the array made from it too.

    Args:
        weights: a caller's weights, in any form; only arrays and tensors are checked.

    Raises:
        TypeError: ``weights`` is a complex numpy array or torch tensor.
    """
    if (isinstance(weights, np.ndarray) and weights.dtype.kind == "c") or (
        is_torch(weights) and weights.is_complex()
    ):
        raise TypeError(f"weights must be real numbers, got {weights.dtype} weights")


class BatchRows(list):
    """A batch's rows, each a view of :attr:`batch`: what ``BatchedLM._run_requests`` returns.

    No row is copied: a row holds its whole batch's memory, which the output cache counts
    once per batch (the shared-block rule of :class:`~genlm.core.backend.ByteLRU`). A numpy
    batch is read-only, so are its rows.
    """

    __slots__ = ("batch", "generation")

    def __init__(self, batch: Any, rows: Any):
        super().__init__(rows)
        #: The ``(B, V)`` array or tensor the rows view.
        self.batch = batch
        #: The output cache's ``generation`` when the batch started computing (set by
        #: ``BatchedLM``; None: unknown, always storable).
        self.generation: int | None = None


def numpy_rows(out: np.ndarray, stable: bool) -> BatchRows:
    """A backend's numpy batch as :class:`BatchRows`: read-only float32 views of one array.

    Args:
        out: the backend's ``(B, V)`` batch, any float dtype.
        stable: the backend never writes to an array it returned (``stable_batches``); else
            the batch is copied once, so the rows stay what they were.
    """
    if stable:
        out = np.ascontiguousarray(out, dtype=np.float32)  # a copy only if it must convert
    else:
        out = np.array(out, dtype=np.float32, order="C")
    out.setflags(write=False)
    return BatchRows(out, out)  # iterating an array makes its row views in C


def split_torch(out: Any, expected: tuple[int, int], name: str, stable: bool) -> BatchRows:
    """A backend's ``(B, V)`` torch batch as :class:`BatchRows` on its device: float32 row
    views of one contiguous tensor (copied once unless ``stable``, as in :func:`numpy_rows`).

    Raises:
        BackendError: the batch has another shape, or is not floating point.
    """
    import torch

    if tuple(out.shape) != expected or not out.is_floating_point():
        raise BackendError(
            f"{name}: backend returned log-probabilities of shape {tuple(out.shape)} "
            f"and dtype {out.dtype}, expected floats of shape {expected}"
        )
    batch = out.detach()
    if batch.dtype != torch.float32:
        batch = batch.to(torch.float32)  # a new tensor: nobody else writes to it
    elif not stable:
        batch = batch.clone(memory_format=torch.contiguous_format)
    batch = batch.contiguous()  # a no-op unless the batch was strided
    return BatchRows(batch, batch.unbind(0))


def compact_row(row: Any) -> Any:
    """``row`` itself if it holds exactly its own memory, else a copy that does (a
    read-only numpy copy, or a torch clone on the row's device).

    Rows are views of their batch: whoever keeps one apart from core's output cache (the
    output cache's own break-up of a batch, genlm-bytes' mass cache) and counts its bytes
    keeps this instead, so that no whole batch stays alive uncounted behind a row. A token-byte
    trie's output holds its own memory when its pooled block is exactly its size; a block
    reused from the pool may be up to twice that (``TokenByteTrie``'s output memory), and a
    batched output's rows share one.
    """
    if isinstance(row, np.ndarray):
        if row.base is None or _whole_trie_block(row):
            return row
        row = row.copy()
        row.setflags(write=False)
        return row
    if row.untyped_storage().nbytes() == row.nbytes:
        return row
    return row.clone()


def _whole_trie_block(row: np.ndarray) -> bool:
    """Whether ``row`` views all of a trie output block (``_trie_kernel.Block``), which then
    holds exactly the row; no block can exist unless the C module was imported."""
    kernel = sys.modules.get("genlm.core._trie_kernel")
    if kernel is None:
        return False
    base = row.base
    while isinstance(base, np.ndarray):
        base = base.base
    block = getattr(kernel, "Block", None)  # None: a C module built before Block was exposed
    return block is not None and type(base) is block and base.allocated == row.nbytes


def as_output(row: Any, output: Output) -> Any:
    """One row in the requested form.

    numpy rows asked for as torch are copied once into a fresh CPU tensor (the cached array is
    read-only, a tensor view of it would let callers write into the cache); torch rows asked
    for as torch are returned as they are (shared with the cache: do not modify in place).
    """
    if output == "torch":
        import torch

        return row if isinstance(row, torch.Tensor) else torch.from_numpy(np.array(row))
    if is_torch(row):
        array = row.cpu().numpy()
        array.setflags(write=False)
        return array
    return row


def stack_output(rows: Sequence[Any], width: int, output: Output) -> Any:
    """Rows stacked into one ``(len(rows), width)`` batch in the requested form.

    Stacking copies once; a torch batch stays on the rows' device, a numpy batch of torch rows
    crosses to the host in one transfer.
    """
    torch_rows = bool(rows) and is_torch(rows[0])
    if output == "torch" or torch_rows:
        import torch

        if not rows:
            batch = torch.empty((0, width), dtype=torch.float32)
        elif torch_rows:
            device = rows[0].device
            batch = torch.stack(
                [r if is_torch(r) else torch.from_numpy(np.array(r)).to(device) for r in rows]
            )
        else:
            batch = torch.from_numpy(np.array(rows, dtype=np.float32))
        return batch if output == "torch" else batch.cpu().numpy()
    if not rows:
        return np.empty((0, width), dtype=np.float32)
    return np.array(rows, dtype=np.float32)  # one C-level copy; np.stack costs twice as much


def row_summary(out: Any) -> tuple[np.ndarray, float]:
    """Each row's maximum and the first row's ``logsumexp`` (summed in float64), for the
    row checks.

    Computed where the rows are (numpy, or torch on its device: one ``max`` and one
    ``logsumexp`` there, then ``B + 1`` numbers to the host), so checking device rows costs
    no copy of the rows themselves. An empty batch gives an empty maximum and 0.
    """
    if len(out) == 0:
        return np.empty(0), 0.0
    if is_torch(out):
        import torch

        row_max = out.detach().amax(dim=1).float().cpu().numpy()
        first = float(torch.logsumexp(out[0].detach().double(), dim=0))
        return row_max, first
    row_max = np.maximum.reduce(out, axis=1)  # ``out.max`` adds a Python call
    top = float(row_max[0])
    if not math.isfinite(top):
        return row_max, top
    # The exponentials in the rows' own dtype (float32: vectorized, and each term's rounding,
    # ~1e-7 relative, is far below the check's tolerance), their sum in float64. Four numpy
    # calls in all: at small batches their fixed cost, not the arithmetic, is the price.
    terms = np.subtract(out[0], top)
    np.exp(terms, out=terms)
    return row_max, top + math.log(np.add.reduce(terms, dtype=np.float64))
