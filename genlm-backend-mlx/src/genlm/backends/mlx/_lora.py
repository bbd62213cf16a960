"""mlx-lm LoRA adapters: reading one, and the LoRA layers a model wears for all of them.

An adapter is what ``mlx_lm.lora`` saves: ``adapter_config.json`` (``fine_tune_type``
``"lora"`` or ``"dora"``, ``num_layers``, ``lora_parameters``) and ``adapters.safetensors``
(the ``lora_a``/``lora_b`` arrays, and DoRA's ``m``). mlx-lm applies one by replacing the
model's linear layers with LoRA layers (``linear_to_lora_layers``), once; an adapter is
then only the values of those layers' arrays. So a model serves many adapters by wrapping
its layers once, keeping each adapter's arrays, and putting a batch's adapter's arrays in
place before its forward pass; the base model is the arrays the wrap starts from (``lora_b``
zero: each LoRA layer adds nothing). Every adapter of one model must therefore share the
wrap's layout: the same layers, rank, scale and kind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

#: The arrays of an adapter, as (parameter path, array) pairs.
Weights = list[tuple[str, mx.array]]

#: The names of the arrays LoRA and DoRA layers add (the last part of a parameter path).
ADAPTER_LEAVES = ("lora_a", "lora_b", "m")


@attrs.frozen
class Layout:
    """What ``linear_to_lora_layers`` makes of a model: every adapter on it must match."""

    #: How many of the last layers are wrapped, at most the model's depth (mlx-lm wraps
    #: them all for a count <= 0 or past the depth).
    num_layers: int
    #: ``lora_parameters`` as the adapter's configuration gives them (rank, scale, ...).
    parameters: dict[str, Any] = attrs.field(eq=False)
    dora: bool
    #: What of ``parameters`` shapes the wrap or the rows, as sorted JSON, so layouts
    #: compare by value: not ``dropout`` (off in evaluation mode, a training setting
    #: adapters differ in), nor the order of ``keys``.
    key: str = attrs.field(init=False)

    @key.default
    def _key(self) -> str:
        shaping = {name: v for name, v in self.parameters.items() if name != "dropout"}
        if isinstance(shaping.get("keys"), list):
            shaping["keys"] = sorted(shaping["keys"])
        return json.dumps(shaping, sort_keys=True)


@attrs.frozen
class Adapter:
    """A loaded adapter: its KV marker (its prefix entries' first key element: adapters
    never share KV) and its arrays."""

    marker: int
    weights: Weights


def read_layout(path: Path, depth: int) -> Layout:
    """The layout ``path``'s ``adapter_config.json`` asks for, of a model ``depth`` layers
    deep.

    Raises:
        FileNotFoundError: no ``adapter_config.json`` there.
        ValueError: not a LoRA or DoRA adapter, or a configuration without its
            ``num_layers`` and ``lora_parameters`` (with their rank, scale and dropout).
    """
    config_file = path / "adapter_config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no mlx-lm adapter at {path}: {config_file.name} is missing")
    config = json.loads(config_file.read_text())
    kind = config.get("fine_tune_type", "lora")
    if kind not in ("lora", "dora"):
        raise ValueError(
            f"the adapter at {path} is a {kind!r} fine-tune; MLXLM serves LoRA and DoRA "
            "adapters (a full fine-tune is a model of its own: load it with from_name)"
        )
    try:
        num_layers = int(config["num_layers"])
        parameters = dict(config["lora_parameters"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"{config_file} lacks mlx-lm's num_layers and lora_parameters ({error!r})"
        ) from error
    wrapped = depth if num_layers <= 0 or num_layers > depth else num_layers
    layout = Layout(wrapped, parameters, kind == "dora")
    missing = [k for k in ("rank", "scale", "dropout") if k not in layout.parameters]
    if missing:  # mlx-lm would fail part-way through wrapping the model's layers
        raise ValueError(f"{config_file}: lora_parameters lacks {', '.join(missing)}")
    return layout


def adapter_arrays(model: nn.Module) -> Weights:
    """The LoRA arrays a wrapped model holds now."""
    return [
        (name, array)
        for name, array in tree_flatten(model.parameters())
        if name.rsplit(".", 1)[-1] in ADAPTER_LEAVES
    ]


def wrap(model: nn.Module, layout: Layout) -> tuple[Weights, Callable[[], None]]:
    """Put LoRA layers into ``model`` as ``layout`` says (in evaluation mode: fresh layers
    train, with dropout on): the arrays they start from, which leave the model's outputs
    as they were (the base model's weights), and a function that puts the model's own
    layers back (for an adapter refused after the wrap).

    Raises:
        ValueError: mlx-lm could not wrap the layers as asked (a module of a kind it
            cannot wrap, say); the model is as it was.
    """
    from mlx_lm.tuner.utils import linear_to_lora_layers

    before = dict(model.named_modules())

    def undo() -> None:
        now = dict(model.named_modules())
        replaced = [(name, m) for name, m in before.items() if name and now.get(name) is not m]
        model.update_modules(tree_unflatten(replaced))

    try:
        linear_to_lora_layers(model, layout.num_layers, layout.parameters, use_dora=layout.dora)
    except Exception as error:  # mlx-lm wraps layer by layer: some may be wrapped already
        undo()
        raise ValueError(
            f"mlx-lm cannot put LoRA layers into this model as asked ({layout.key}): {error}"
        ) from error
    model.eval()
    base = adapter_arrays(model)
    mx.eval([array for _, array in base])
    return base, undo


def read_weights(path: Path, base: Weights) -> Weights:
    """The arrays of the adapter at ``path``, evaluated, one for each of ``base``'s (the
    wrapped model's LoRA arrays: same names, same shapes).

    Raises:
        FileNotFoundError: no ``adapters.safetensors`` there.
        ValueError: an array the model has no place for, of another shape, or missing.
    """
    weights_file = path / "adapters.safetensors"
    if not weights_file.is_file():
        raise FileNotFoundError(f"no mlx-lm adapter at {path}: {weights_file.name} is missing")
    loaded = {
        name: array
        for name, array in mx.load(str(weights_file)).items()
        if name.rsplit(".", 1)[-1] in ADAPTER_LEAVES
    }
    places = dict(base)
    problems = [
        f"{name}: no such LoRA array in the model" for name in sorted(loaded.keys() - places)
    ]
    problems += [
        f"{name}: shape {tuple(loaded[name].shape)}, the model's is {tuple(places[name].shape)}"
        for name in sorted(loaded.keys() & places.keys())
        if loaded[name].shape != places[name].shape
    ]
    problems += [f"{name}: missing" for name in sorted(places.keys() - loaded.keys())]
    if problems:
        raise ValueError(
            f"the adapter at {path} does not fit the model's LoRA layers:\n  "
            + "\n  ".join(problems)
        )
    weights = [(name, loaded[name].astype(places[name].dtype)) for name, _ in base]
    mx.eval([array for _, array in weights])
    return weights
