"""A toy model with LoRA adapters: each adapter rolls the mock's rows by its shift, so every
adapter's rows are known exactly (the mock's row, rolled)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from genlm.core.backend import LoraAdapters
from genlm.core.mock import MockLM


class RolledLM(LoraAdapters, MockLM):
    """A mock whose adapters roll its rows; ``released`` lists what removal freed."""

    def __init__(self, vocab: Sequence[bytes]) -> None:
        super().__init__(vocab)
        self.released: list[tuple[str, int]] = []

    def _load_adapter(self, shift: int, name: str) -> int:
        """The adapter "saved at" ``shift`` is the shift itself (``add_lora(shift, name)``);
        anything but an int is a path with no adapter (its load fails)."""
        if not isinstance(shift, int):
            raise FileNotFoundError(f"no adapter at {shift!r}")
        return shift

    def _logprobs_batch(self, contexts, variant):
        rows = super()._logprobs_batch(contexts, None)
        return rows if variant is None else np.roll(rows, self.adapters.get(variant), axis=1)

    def _release_adapter(self, name: str, shift: int) -> None:
        self.released.append((name, shift))
