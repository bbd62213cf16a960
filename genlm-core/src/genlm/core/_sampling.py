"""Drawing a token from log-probabilities, exactly and reproducibly."""

from __future__ import annotations

import numpy as np


def sample_token(logprobs: np.ndarray, rng: np.random.Generator, temperature: float = 1.0) -> int:
    """Draw a token id from ``softmax(logprobs / temperature)``; ``temperature=0`` is argmax.

    Uses the Gumbel-max trick in float64, so tiny probabilities keep their exact
    chance and no renormalization is needed.
    """
    if temperature == 0:
        return int(np.argmax(logprobs))
    scores = logprobs.astype(np.float64) / temperature
    return int(np.argmax(scores + rng.gumbel(size=scores.shape)))
