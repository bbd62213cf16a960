"""``FaultyLM``: a backend that fails on demand, to drive core through its failure paths.

A :class:`~genlm.core.backend.BatchedLM` over a small vocabulary whose healthy rows are
:func:`genlm.core.mock.mock_logprobs` (so a test can check a result against an
independent expectation). A :class:`Fault` says what goes wrong; it is attached

* to a context (``lm.fail_context(ctx, fault)``): applied in every batch holding it,
  until ``lm.heal(ctx)``; or
* to the next backend calls (``lm.fail_next_call(fault, ...)``): one fault per call
  (per batch), in order, whatever the contexts.

A fault can block on an :class:`threading.Event` (always with a timeout, so a test that
forgets to release it fails instead of hanging), sleep, raise a chosen exception (an
instance or a class; ``BaseException`` subclasses included), or corrupt rows (NaN,
``+inf``, all ``-inf``, raw logits, the wrong shape or dtype). The backend records what
it saw (``batches``, ``batch_variants``), signals when a batch starts (``started``), and
counts the ``_clear_backend_cache`` and ``_close_backend`` calls; a fault can fail those
too. Setting ``lm.variant`` (any hashable, like an active adapter) changes the variant
captured by later requests, so batches of different groups can be driven as well.

Example::

    lm = FaultyLM()
    gate = threading.Event()
    lm.fail_next_call(Fault(block=gate))               # the first batch waits for gate
    lm.fail_context((3,), Fault(bad_row="nan"))         # any batch with (3,) returns NaN
    lm.close_fault = Fault(raises=RuntimeError("boom")) # _close_backend raises
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Hashable, Sequence
from typing import Any, Literal

import attrs
import numpy as np

from genlm.core import Vocabulary
from genlm.core.backend import BatchedLM
from genlm.core.mock import mock_logprobs

#: How a fault corrupts the rows of its batch (or of its context's row):
#: ``nan``: one NaN entry; ``posinf``: one ``+inf`` entry; ``neginf``: every entry
#: ``-inf``; ``logits``: unnormalized (every entry + 5); ``shifted``: ``row - max(row)``
#: (maximum 0 but mass above 1, only the logsumexp check sees it); ``wide``: one
#: column too many (batch-wide); ``short``: one row too few (batch-wide); ``int``:
#: integer dtype (batch-wide).
BadRow = Literal["nan", "posinf", "neginf", "logits", "shifted", "wide", "short", "int"]

#: Longest a fault blocks on its event before raising TimeoutError (a test bug guard).
BLOCK_LIMIT_S = 30.0


@attrs.define
class Fault:
    """What goes wrong in a backend call; the actions apply in this order.

    Attributes:
        block: wait for this event first (at most :data:`BLOCK_LIMIT_S`, then
            ``TimeoutError``).
        sleep_s: then sleep this long.
        raises: then raise this (an exception instance or class).
        bad_row: else corrupt the rows this way (see :data:`BadRow`).
    """

    block: threading.Event | None = None
    sleep_s: float = 0.0
    raises: BaseException | type[BaseException] | None = None
    bad_row: BadRow | None = None

    def act(self) -> None:
        """Block, sleep and raise as configured (rows are corrupted by the caller)."""
        if self.block is not None and not self.block.wait(BLOCK_LIMIT_S):
            raise TimeoutError(f"fault: the block event was not set within {BLOCK_LIMIT_S} s")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.raises is not None:
            raise self.raises


class FaultyLM(BatchedLM):
    """A deterministic model over ``vocab_size`` one-byte tokens that fails on demand.

    Args:
        vocab_size: the number of tokens (token ``i`` is the byte ``i``).
        seed: seed of the healthy rows (``mock_logprobs(context, vocab_size, seed)``).
        **kwargs: scheduler and cache options of :class:`BatchedLM` (``name`` defaults
            to ``"faulty"``).
    """

    def __init__(self, vocab_size: int = 8, *, seed: int = 0, **kwargs: Any):
        kwargs.setdefault("name", "faulty")
        super().__init__(Vocabulary(tuple(bytes([i]) for i in range(vocab_size))), **kwargs)
        self.seed = seed
        self.context_faults: dict[tuple[int, ...], Fault] = {}
        self.call_faults: collections.deque[Fault] = collections.deque()
        #: Faults of the ``_clear_backend_cache`` and ``_close_backend`` hooks.
        self.clear_fault: Fault | None = None
        self.close_fault: Fault | None = None
        #: What later requests capture as their variant (a batch holds one variant).
        self.variant: Hashable = None
        #: Contexts of every backend call, in order (failed calls included), and the
        #: variant of each.
        self.batches: list[list[tuple[int, ...]]] = []
        self.batch_variants: list[Hashable] = []
        #: Set when a backend call starts (clear it to wait for the next one).
        self.started = threading.Event()
        self.clears = 0
        self.closes = 0
        #: Set once ``_close_backend`` has run (the backend state is released).
        self.released = threading.Event()

    def expected(self, context: Sequence[int]) -> np.ndarray:
        """The healthy row of ``context``, float64."""
        return mock_logprobs(tuple(context), len(self.vocab), self.seed)

    def fail_context(self, context: Sequence[int], fault: Fault) -> None:
        """Apply ``fault`` to every batch holding ``context`` until :meth:`heal`."""
        self.context_faults[tuple(context)] = fault

    def heal(self, context: Sequence[int]) -> None:
        """Stop failing ``context``."""
        self.context_faults.pop(tuple(context), None)

    def fail_next_call(self, *faults: Fault) -> None:
        """Apply each fault to one of the next backend calls, in order."""
        self.call_faults.extend(faults)

    def _variant(self) -> Hashable:
        return self.variant

    def _logprobs_batch(self, contexts: list[tuple[int, ...]], variant: Hashable) -> np.ndarray:
        self.batches.append(list(contexts))
        self.batch_variants.append(variant)
        self.started.set()
        out = np.stack([self.expected(c) for c in contexts])
        faults = [(None, self.call_faults.popleft())] if self.call_faults else []
        faults += [
            (i, self.context_faults[c]) for i, c in enumerate(contexts) if c in self.context_faults
        ]
        for row, fault in faults:
            fault.act()
            if fault.bad_row is not None:
                out = _corrupt(out, fault.bad_row, row)
        return out

    def _clear_backend_cache(self) -> None:
        self.clears += 1
        if self.clear_fault is not None:
            self.clear_fault.act()

    def _close_backend(self) -> None:
        self.closes += 1
        try:
            if self.close_fault is not None:
                self.close_fault.act()
        finally:
            self.released.set()


def _corrupt(out: np.ndarray, how: BadRow, row: int | None) -> np.ndarray:
    """``out`` corrupted as ``how`` says, in ``row`` (or every row if None)."""
    rows = slice(None) if row is None else row
    out = out.copy()
    if how == "nan":
        out[rows, 1] = np.nan
    elif how == "posinf":
        out[rows, 1] = np.inf
    elif how == "neginf":
        out[rows] = -np.inf
    elif how == "logits":
        out[rows] += 5.0
    elif how == "shifted":
        out[rows] -= out[rows].max(axis=-1, keepdims=True)
    elif how == "wide":
        out = np.concatenate([out, out[:, :1]], axis=1)
    elif how == "short":
        out = out[:-1]
    elif how == "int":
        out = out.astype(np.int64)
    else:
        raise ValueError(f"unknown bad row {how!r}")
    return out


def within(timeout_s: float, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` run on a daemon thread; its result, or its exception re-raised.

    Fails the test (AssertionError) if the call is still blocked after ``timeout_s``,
    so a regression that hangs a blocking call fails instead of hanging the suite.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome["exc"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"{fn!r} still blocked after {timeout_s} s"
    if "exc" in outcome:
        raise outcome["exc"]
    return outcome["result"]
