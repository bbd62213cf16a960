"""The mlx tests' independent expectation: one plain, uncached forward of a context alone."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np


def plain_logprobs(model, context: Sequence[int]) -> np.ndarray:
    """log_softmax (float32) of the last position's logits of one uncached forward."""
    logits = model(mx.array([list(context)]))[0, -1].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits))
