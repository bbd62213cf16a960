"""Capturing each request's full next-token row inside vLLM's sampler, keyed by request.

vLLM V1 applies class-based logits processors to the whole batch of logits,
``(num_requests_in_batch, vocab)``, and tells them how the persistent batch changes
(requests added, removed, moved or swapped) through ``update_state``. A request
tags itself with ``SamplingParams(extra_args={ROW_KEY: key})``; the processor keeps
``batch index -> key`` in step with every change, so the rows land under the right
key however the scheduler splits, interleaves or reorders requests.

Which row is the one we want: while a long prompt is prefilled in chunks, every
chunk step also produces a row (for the chunk's last token), and vLLM discards the
token sampled from it. A request's output-token list (which vLLM hands us by
reference) stays empty until a real token is accepted, so the row recorded last
while that list is empty is the row after the whole prompt.

The processor lives wherever the sampler runs; rows are only reachable from this
process when the engine core and the model run in it (see ``_model.capture_mode``).
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

if TYPE_CHECKING:
    from vllm.config import VllmConfig

#: The ``SamplingParams.extra_args`` entry that asks for a row and names it.
ROW_KEY = "genlm_row_key"

_counter = itertools.count()


class RowSink:
    """Rows captured for one engine: key -> float32 log-probability row (on the device)."""

    def __init__(self) -> None:
        self._rows: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    def put(self, key: str, row: torch.Tensor) -> None:
        with self._lock:
            self._rows[key] = row

    def pop(self, key: str) -> torch.Tensor | None:
        with self._lock:
            return self._rows.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()


class RowCapture(LogitsProcessor):
    """Records the log-softmax of each tagged request's logits; leaves logits unchanged.

    Subclassed once per engine by :func:`capture_class`, which sets ``sink``.
    """

    sink: RowSink

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        #: batch index -> (row key, the request's running output-token list)
        self._slots: dict[int, tuple[str, list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        # False: vLLM then applies it to every batch, greedy requests included.
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._slots.pop(index, None)
        for index, params, _prompt, output_ids in batch_update.added:
            key = (params.extra_args or {}).get(ROW_KEY) if params is not None else None
            if key is None:
                self._slots.pop(index, None)  # an untagged request replaces a tagged one
            else:
                self._slots[index] = (key, output_ids)
        for a, b, direction in batch_update.moved:
            slot_a, slot_b = self._slots.pop(a, None), self._slots.pop(b, None)
            if slot_a is not None:
                self._slots[b] = slot_a
            if direction == MoveDirectionality.SWAP and slot_b is not None:
                self._slots[a] = slot_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        pending = [(i, key) for i, (key, out) in self._slots.items() if not out]
        if pending:
            index = torch.tensor([i for i, _ in pending], device=logits.device)
            rows = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
            for (_, key), row in zip(pending, rows):
                self.sink.put(key, row)
        return logits


def capture_class(sink: RowSink) -> type[RowCapture]:
    """A :class:`RowCapture` subclass bound to ``sink`` (one per engine)."""
    attrs: dict[str, Any] = {"sink": sink, "__module__": __name__}
    return type(f"RowCapture{next(_counter)}", (RowCapture,), attrs)
