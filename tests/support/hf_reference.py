"""The hf tests' independent expectation over random-weight models of other architectures:
one plain, uncached transformers forward of a context alone."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import transformers

#: The dimensions of the tests' tiny Llama-shaped models (Llama, Mistral, Phi-3...).
SMALL = dict(
    vocab_size=512,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def random_model(config, dtype: torch.dtype, attention: str | None = None) -> torch.nn.Module:
    """A random model of ``config`` in ``dtype`` (with ``attention`` as its
    ``attn_implementation``, or the default) whose attention is far from uniform (weights
    scaled up), so a row that attended the wrong columns or positions would differ."""
    torch.manual_seed(0)
    options = {} if attention is None else {"attn_implementation": attention}
    model = transformers.AutoModelForCausalLM.from_config(config, **options).to(dtype).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.mul_(3.0)
    return model


def plain_forward(model, context: Sequence[int], width: int | None = None) -> np.ndarray:
    """log_softmax (float64) of the last position's logits of the context's own unbatched
    forward (no padding), over the first ``width`` logits (all of them by default)."""
    with torch.inference_mode():
        logits = model(torch.tensor([list(context)])).logits[0, -1, :width]
    return torch.log_softmax(logits.double(), -1).numpy()
