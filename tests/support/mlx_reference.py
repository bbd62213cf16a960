"""The mlx tests' independent expectation: one plain, uncached forward of a context alone;
and LoRA adapters saved as ``mlx_lm.lora`` saves them, which mlx-lm's own loader reads."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
import numpy as np

#: The LoRA layers of the tests' adapters: the last 3 of stories260K's 5 layers.
LORA_LAYOUT = {"num_layers": 3, "lora_parameters": {"rank": 4, "scale": 2.0, "dropout": 0.0}}


def plain_logprobs(model, context: Sequence[int]) -> np.ndarray:
    """log_softmax (float32) of the last position's logits of one uncached forward."""
    logits = model(mx.array([list(context)]))[0, -1].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits))


def save_lora_adapter(
    out: Path, model_dir: str, seed: int, layout: dict = LORA_LAYOUT, kind: str = "lora"
) -> Path:
    """An mlx-lm LoRA (or, with ``kind="dora"``, DoRA) adapter of the model at
    ``model_dir``, saved in ``out`` (created), its A and B drawn from ``seed`` (a trained
    adapter's B starts at zero; random ones move rows by whole nats) and DoRA's magnitudes
    ``m`` the wrap's own, scaled by up to 20%."""
    import mlx_lm
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model, _ = mlx_lm.load(model_dir)
    linear_to_lora_layers(
        model, layout["num_layers"], layout["lora_parameters"], use_dora=kind == "dora"
    )
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, array in tree_flatten(model.parameters()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("lora_a", "lora_b"):
            arrays[name] = mx.array(rng.normal(0.0, 0.5, array.shape).astype(np.float32))
        elif leaf == "m":
            scale = rng.uniform(0.8, 1.2, array.shape).astype(np.float32)
            arrays[name] = array.astype(mx.float32) * mx.array(scale)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), arrays)
    (out / "adapter_config.json").write_text(json.dumps({"fine_tune_type": kind, **layout}))
    return out
