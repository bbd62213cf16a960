"""``AsyncTokenByteTrie``: trie mass computations batched through core's scheduler.

A byte-level model with a beam of K candidates asks for K trie sums per step, from
concurrent coroutines. Stacking them into one ``(K, V)`` call is much faster than K
single calls (one pass over the trie's index arrays), and running it on a worker
thread keeps the event loop free, exactly as for a model's forward pass.

Rows may be numpy arrays or torch tensors (on any device): a batch holds rows of one
kind and device, stacked where they are, and torch rows get float64 tensors on their
device back (see ``_trie_torch``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

from genlm.core._scheduler import AutoBatcher
from genlm.core._trie import TokenByteTrie, _check_real, _is_torch, float64_weights
from genlm.core._worker import ModelWorker

#: Operation name -> the batched trie method computing it.
_OPERATIONS: dict[str, Callable[[TokenByteTrie, np.ndarray], np.ndarray]] = {
    "weight_sum": TokenByteTrie.batch_weight_sum,
    "weight_max": TokenByteTrie.batch_weight_max,
    "log_weight_sum": TokenByteTrie.batch_log_weight_sum,
    "log_weight_max": TokenByteTrie.batch_log_weight_max,
}


class AsyncTokenByteTrie:
    """Awaitable per-row trie computations, gathered into batched calls.

    Each method takes one row of ``vocab_size`` values (a numpy array, or a torch tensor
    batched with the other calls on its device) and returns what the
    :class:`TokenByteTrie` method of the same name returns for it: one float64 value per
    node (a tensor on the input's device for torch input). A row of another shape raises
    ``ValueError``, one that is not numbers (a string array, a quantized tensor) a
    ``TypeError`` or ``ValueError`` saying so, before it is batched, so the calls batched
    with it are unaffected; after :meth:`aclose`, ``ModelClosedError``.

    Each result is a row view of its batch's output, so a row that is kept keeps the
    whole batch's memory alive (and out of the trie's output pool); ``.copy()`` rows
    that are kept long.

    Args:
        trie: the trie to compute over.
        max_batch_size: most rows per batched call.
        max_wait_s: longest time the first row waits for company.

    Raises:
        TypeError: ``trie`` is not a :class:`TokenByteTrie` (a vocabulary, say): checked
            here, since every call runs the trie's own batched methods.
    """

    def __init__(self, trie: TokenByteTrie, *, max_batch_size: int = 64, max_wait_s: float = 0.0):
        if not isinstance(trie, TokenByteTrie):
            raise TypeError(
                "trie must be a genlm.core.TokenByteTrie (build one with "
                f"TokenByteTrie(vocab)), got {type(trie).__name__} {trie!r:.60}"
            )
        self.trie = trie
        self.worker = ModelWorker("genlm-trie")
        # Dropped without aclose(), it stops its thread (the finalizer holds the worker
        # only); not at exit, as BatchedLM's.
        weakref.finalize(self, self.worker.close, wait=False).atexit = False
        # Items are (operation, where, row): "numpy", or the torch device of the row. The
        # method is held weakly, as BatchedLM's: the batcher must not keep the trie alive.
        self.batcher: AutoBatcher[tuple[str, str, np.ndarray], np.ndarray] = AutoBatcher(
            weakref.WeakMethod(self._run),
            self.worker,
            max_batch_size=max_batch_size,
            max_wait_s=max_wait_s,
            group=lambda item: item[:2],
        )

    def _run(self, items: list[tuple[str, str, np.ndarray]]) -> np.ndarray:
        operation = _OPERATIONS[items[0][0]]
        rows = [row for _, _, row in items]
        if items[0][1] == "numpy":
            return operation(self.trie, np.stack(rows))
        import torch  # already imported: the caller handed torch rows

        return operation(self.trie, torch.stack(rows))

    async def _submit(self, operation: str, row: np.ndarray) -> np.ndarray:
        # Each row is read as float64 here, on its own: a row that is not numbers fails
        # alone instead of failing the stack of every row batched with it. It is copied
        # where that read kept the caller's memory (a float64 row): the batch runs later,
        # and a caller may refill one buffer between calls, as the direct calls allow.
        where = str(row.device) if _is_torch(row) else "numpy"
        if where == "numpy":
            weights = float64_weights(row)
            if weights is row or not weights.flags.owndata:  # a view of the caller's buffer
                weights = weights.copy()
            row = weights
        if tuple(row.shape) != (self.trie.vocab_size,):
            raise ValueError(
                f"expected one row of {self.trie.vocab_size} weights, got shape {tuple(row.shape)}"
            )
        if where != "numpy":
            _check_real(row)
            try:
                weights = row.detach().double()  # on its device; float8 rows do not stack
            except RuntimeError as error:  # e.g. a quantized tensor
                raise TypeError(
                    f"a torch row of dtype {row.dtype} cannot be read as float64 weights: {error}"
                ) from error
            # A float64 tensor comes back as itself: copied, as a numpy row is.
            row = weights.clone() if weights.data_ptr() == row.data_ptr() else weights
        return await self.batcher.submit((operation, where, row))

    async def weight_sum(self, weights: np.ndarray) -> np.ndarray:
        """:meth:`TokenByteTrie.weight_sum`, batched with concurrent calls."""
        return await self._submit("weight_sum", weights)

    async def weight_max(self, weights: np.ndarray) -> np.ndarray:
        """:meth:`TokenByteTrie.weight_max`, batched with concurrent calls."""
        return await self._submit("weight_max", weights)

    async def log_weight_sum(self, logprobs: np.ndarray) -> np.ndarray:
        """:meth:`TokenByteTrie.log_weight_sum`, batched with concurrent calls."""
        return await self._submit("log_weight_sum", logprobs)

    async def log_weight_max(self, logprobs: np.ndarray) -> np.ndarray:
        """:meth:`TokenByteTrie.log_weight_max`, batched with concurrent calls."""
        return await self._submit("log_weight_max", logprobs)

    async def aclose(self) -> None:
        """Fail queued calls, finish the running one, stop the worker thread."""
        await self.batcher.aclose()
        self.worker.close(wait=False)

    async def __aenter__(self) -> AsyncTokenByteTrie:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
