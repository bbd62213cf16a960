"""``MLXLM``: next-token log-probabilities from an mlx-lm model, batched and prefix-cached.

Thread affinity. MLX ties every lazy (not yet evaluated) array to a stream of the thread
that built it; evaluating it on another thread fails ("There is no Stream(cpu, 0) in
current thread"), while evaluated arrays can be used anywhere. So the constructor first
evaluates every array of the model (parameters and private buffers such as Llama 3's RoPE
frequencies) on the thread that loaded it, and from then on every MLX operation (forward
passes, cache merges, dtype casts) runs on the model's worker thread, which also adopts
the caller's default device.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from genlm.backends.mlx import _kv, _lora
from genlm.core import ModelClosedError, Vocabulary
from genlm.core.backend import (
    BatchedLM,
    LoraAdapters,
    checked_count,
    group_equal,
    plan_rows,
    resolve_model_path,
)

logger = logging.getLogger(__name__)


class MLXLM(LoraAdapters, BatchedLM):
    """An mlx-lm model behind GenLM's batched, cached ``AsyncLM`` interface.

    A context that extends a kept prefix runs only its new tokens, and rows with different
    kept lengths share one forward pass. The last batch's caches stay live: a batch whose
    contexts all extend its rows by the same number of tokens (an SMC step, resampled or
    not) runs in place, without copying any row's past. Other batches resume from compact
    copies in a :class:`~genlm.core.backend.PrefixCache`: the rows of every such batch, and those
    of a live batch when a batch breaks its pattern (contexts a live batch ran and then
    extended are not kept). ``kv_cache_bytes`` bounds the copies and the live batch.
    Models whose caches cannot resume from a prefix (sliding-window or state-space layers)
    recompute every context in full, with one warning when the model is wrapped.

    LoRA adapters saved by mlx-lm (:meth:`add_lora`, then :meth:`set_lora` or a request's
    ``variant=``): the model's layers become LoRA layers at the first one, and each batch
    runs under its adapter's arrays; adapters keep their KV apart.

    Args:
        model: a loaded mlx-lm model (``mlx_lm.load(...)[0]``), fully built on this thread.
        tokenizer: its tokenizer: mlx-lm's ``TokenizerWrapper`` or a transformers tokenizer.
        kv_cache_bytes: byte budget of the prefix KV cache (0 disables reuse).
        prefill_chunk_size: longest run of new tokens fed to the model in one call; long
            prompts are prefilled in chunks so the lazy graph and activations stay small.
        **kwargs: scheduler and output-cache options of :class:`~genlm.core.backend.BatchedLM`;
            ``max_context_length`` defaults to the model's maximum positions (see
            :func:`_max_positions`; None where its arguments name none, or to lift it).
    """

    #: Each batch views a new (immutable) MLX array: core keeps it without a copy.
    stable_batches = True
    #: MLX aborts the process at exit when a thread that ran it has ended
    #: (ml-explore/mlx#3126, mlx 0.32.4): the closed model's worker thread parks instead.
    park_worker_thread = True

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        kv_cache_bytes: int = 512 * 2**20,
        prefill_chunk_size: int = 2048,
        **kwargs: Any,
    ):
        _check_model(model)
        prefill_chunk_size = checked_count("prefill_chunk_size", prefill_chunk_size, 1)
        _materialize(model)
        hf_tokenizer = _unwrap(tokenizer)
        args = _text_args(model)
        vocab = Vocabulary.from_tokenizer(hf_tokenizer, size=_positive_arg(args, "vocab_size"))
        # mlx-lm's wrapper holds the model's EOS ids (its configuration's and the tokenizer's):
        # the ids its generation stops on (a set, ordered here).
        eos = getattr(tokenizer, "eos_token_ids", None)
        vocab = vocab.with_model_eos(sorted(eos) if isinstance(eos, (set, frozenset)) else eos)
        kwargs.setdefault("name", "mlx")
        kwargs.setdefault("max_context_length", _max_positions(args))
        # Whether KV can resume, found here: whatever fails, fails before the worker thread
        # starts (a thread that ran MLX never ends, see ``park_worker_thread``).
        caches = make_prompt_cache(model)
        blocked = _kv.non_resumable_types(caches)
        problem = _kv.batch_resume_problem(model)
        super().__init__(vocab, hf_tokenizer, **kwargs)
        #: The wrapped model; None once closed (see :meth:`_close_backend`).
        self.model: nn.Module | None = model
        self.kv_cache = _kv.KVStore(
            checked_count("kv_cache_bytes", kv_cache_bytes, 0, whole_floats=True)
        )
        self.prefill_chunk_size = prefill_chunk_size
        self._num_layers = len(caches)
        #: The LoRA layers' layout while adapters are loaded (every adapter shares it),
        #: their arrays that leave the model as it was, the arrays on it now, and what puts
        #: the model's own layers back (once the last adapter goes, and at close: the
        #: model may be the caller's).
        self._layout: _lora.Layout | None = None
        self._base_weights: _lora.Weights | None = None
        self._installed: _lora.Weights | None = None
        self._unwrap: Callable[[], None] | None = None
        #: Whether rows resume from stored KV (else every context is recomputed in full).
        self.resumable = not blocked and problem is None
        if not self.resumable:
            logger.warning(
                "%s: %s; every request recomputes its whole context (correct, but slower)",
                self.name,
                problem
                or f"the model's {'/'.join(blocked)} caches cannot resume from a cached prefix",
            )
        self.worker.call(mx.set_default_device, mx.default_device())  # the worker's first call

    @classmethod
    def from_name(cls, name: str, **kwargs: Any) -> MLXLM:
        """Load a model directory, hub id or embedded name (``"stories260K"``) with mlx-lm.

        mlx-lm reads Hugging Face safetensors checkpoints directly (it converts weights on
        load); its errors for a model it cannot find or read propagate.
        """
        model, tokenizer = mlx_lm.load(resolve_model_path(name))
        return cls(model, tokenizer, **kwargs)

    # ---- LoRA ------------------------------------------------------------------------

    def add_lora(self, path: str | os.PathLike, name: str, *, replace: bool = False) -> None:
        """Load the mlx-lm adapter saved at ``path`` (``adapter_config.json`` and
        ``adapters.safetensors``, as ``mlx_lm.lora`` writes them) as a new ``name``; it does
        not become active.

        The first adapter turns the model's layers into LoRA layers (mlx-lm's
        ``linear_to_lora_layers``), which every later adapter must fit: the same
        ``num_layers``, ``lora_parameters`` and kind (LoRA or DoRA). With ``replace``, an
        adapter loaded as ``name`` is replaced once the new one has loaded (see
        :meth:`genlm.core.backend.LoraAdapters.add_lora`); it is among those the new one
        must fit.

        Raises:
            ValueError: an adapter named ``name`` is already loaded (without ``replace``);
                the adapter is a full fine-tune, wants another layout than the adapters
                before it, or has arrays that do not fit the model's LoRA layers (each
                named).
            FileNotFoundError: ``path`` holds no mlx-lm adapter.
        """
        super().add_lora(Path(path), name, replace=replace)

    def _load_adapter(self, path: Path, name: str) -> _lora.Adapter:
        layout = _lora.read_layout(path, len(self.model.layers))
        if self._layout is None:  # the first adapter: it wraps the layers, or leaves no trace
            base, undo = _lora.wrap(self.model, layout)
            try:
                weights = _lora.read_weights(path, base)
            except BaseException:
                undo()
                raise
            # The wrap changes no output: the KV kept stays right.
            self._layout, self._base_weights, self._installed = layout, base, base
            self._unwrap = undo
        elif layout != self._layout:
            raise ValueError(
                f"the adapter at {path} wants LoRA layers {layout.num_layers} layers deep "
                f"with {layout.key} (dora={layout.dora}), but the model's are "
                f"{self._layout.num_layers} deep with {self._layout.key} "
                f"(dora={self._layout.dora}): mlx-lm wraps a model's layers once, so every "
                "adapter on one model must share their layout"
            )
        else:
            weights = _lora.read_weights(path, self._base_weights)
        return _lora.Adapter(self.adapters.new_marker(), weights)

    def _release_adapter(self, name: str, adapter: _lora.Adapter) -> None:
        """Drop the removed adapter's KV, and its arrays from the model if they are on it;
        after the last one, the model's own layers go back (an adapter of another layout
        may load then)."""
        self.kv_cache.forget(adapter.marker)
        if not self.adapters.names:
            self._unwrap_layers()
        elif self._installed is adapter.weights:
            self._install(self._base_weights)
        mx.clear_cache()

    def _unwrap_layers(self) -> None:
        """Put the model's own layers back, if adapters wrapped them (the wrap's base
        arrays compute what they do: the KV kept stays right)."""
        if self._unwrap is not None:
            self._unwrap()
        self._layout = self._base_weights = self._installed = self._unwrap = None

    def _use_variant(self, variant: Hashable) -> int | None:
        """Put the arrays of a batch's adapter (the base model's for None) on the model;
        the adapter's KV marker (None for the base model).

        Raises:
            UnknownVariantError: the adapter was removed after the request was made.
        """
        if variant is None:
            if self._base_weights is not None:
                self._install(self._base_weights)
            return None
        adapter = self.adapters.get(variant)
        self._install(adapter.weights)
        return adapter.marker

    def _install(self, weights: _lora.Weights) -> None:
        if weights is not self._installed:
            self.model.load_weights(weights, strict=False)
            self._installed = weights

    # ---- the backend -------------------------------------------------------------------

    def _logprobs_batch(self, contexts: list[tuple[int, ...]], variant: Hashable) -> np.ndarray:
        marker = self._use_variant(variant)
        if self.resumable and self.kv_cache.max_bytes > 0:
            logprobs = self._resume(contexts, marker)
        else:
            logprobs = self._recompute(contexts)
        mx.eval(logprobs)
        return np.asarray(logprobs)

    def _resume(self, contexts: list[tuple[int, ...]], marker: int | None) -> mx.array:
        """Advance the live batch if every context extends it evenly under the same
        adapter, else spill it and rebuild.

        The live batch is detached first and kept again only once its step succeeds, so a
        failed step never leaves a half-advanced batch live (a failed rebuild may leave the
        live batch of a group it completed before the failure: its rows are whole).
        """
        live = self.kv_cache.release()
        same = live is not None and live.marker == marker
        plan = live.rows.extend_all(contexts) if same else None
        if live is not None and plan is not None:
            return self._advance(live, *plan, contexts)
        if live is not None:
            self._spill(live)
        return self._rebuild(contexts, marker)

    def _advance(
        self, live: _kv.LiveBatch, sources: list[int], new: int, contexts: list[tuple[int, ...]]
    ) -> mx.array:
        """Extend the live batch by ``new`` tokens per row in place, copying nothing out.

        A live batch grown past the whole budget is spilled (what fits) and dropped instead.
        """
        live.advance(sources, contexts)
        live.copied = False
        tokens = mx.array([c[-new:] for c in contexts])
        logprobs = _log_softmax(self._last_logits(tokens, live.caches))
        mx.eval(logprobs)
        if not all(_accepted(logprobs)):  # its batch fails: the live KV may be NaN, drop it
            return logprobs
        if not self.kv_cache.keep(live):
            self._spill(live)
        return logprobs

    def _rebuild(self, contexts: list[tuple[int, ...]], marker: int | None) -> mx.array:
        """Resume each context from its longest stored prefix under the same adapter
        (``marker``), one pass per new-token count.

        Every row is stored in the prefix cache; the largest group's caches also become the
        live batch, if they fit the budget. A row core refuses (NaN: its batch fails) keeps
        no KV, and its group is not kept live: every continuation would resume from it.
        """
        prefixes = self.kv_cache.prefixes
        skip = 0 if marker is None else 1  # the marker leads an adapter's keys

        def lookup(context: tuple[int, ...], limit: int) -> tuple[int, _kv.PrefixKV | None]:
            hit = prefixes.longest_prefix(_kv.key(context, marker), max_length=limit + skip)
            return max(hit.length - skip, 0), hit.value

        rows = plan_rows(contexts, lookup)
        groups = group_equal([row.new for row in rows])
        largest = max(groups, key=len)
        outputs = []
        for group in groups:
            tokens = mx.array([rows[i].context[rows[i].past :] for i in group])
            caches = _kv.merge([rows[i].cached for i in group], self._num_layers, tokens.shape[1])
            outputs.append(_log_softmax(self._last_logits(tokens, caches)))
            entries = _kv.split(caches)
            mx.eval(outputs[-1], entries)
            accepted = _accepted(outputs[-1])
            for i, entry, ok in zip(group, entries, accepted):
                if ok:
                    prefixes.insert(_kv.key(contexts[i], marker), entry, _kv.nbytes(entry))
            if group is largest and all(accepted):
                self.kv_cache.keep(_kv.LiveBatch([contexts[i] for i in group], caches, marker))
        return _in_order(groups, outputs)

    def _spill(self, live: _kv.LiveBatch) -> None:
        """Store compact copies of the rows of ``live`` (a batch being dropped), if needed."""
        if live.copied:
            return
        live.copied = True
        entries = _kv.split(live.caches)
        mx.eval(entries)
        for context, entry in zip(live.contexts, entries):
            self.kv_cache.prefixes.insert(_kv.key(context, live.marker), entry, _kv.nbytes(entry))

    def _recompute(self, contexts: list[tuple[int, ...]]) -> mx.array:
        """Full forward passes, one per context length (equal lengths need no padding)."""
        groups = group_equal([len(c) for c in contexts])
        outputs = []
        for group in groups:
            tokens = mx.array([contexts[i] for i in group])
            outputs.append(_log_softmax(self._last_logits(tokens, make_prompt_cache(self.model))))
        return _in_order(groups, outputs)

    def _last_logits(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        """Logits after the last column of ``tokens``, shape ``(rows, V)``, filling ``cache``.

        All but the last token go through a first call whose logits are never evaluated:
        MLX is lazy, so the vocabulary projection of those positions is never computed
        (for a 160-token prompt and a 50k vocabulary that is most of the work). Long runs
        go in chunks of ``prefill_chunk_size``, evaluating the cache after each.
        """
        step = self.prefill_chunk_size
        for start in range(0, tokens.shape[1] - 1, step):
            self.model(tokens[:, start : min(start + step, tokens.shape[1] - 1)], cache=cache)
            if tokens.shape[1] - 1 > step:
                mx.eval([c.state for c in cache])
        return self.model(tokens[:, -1:], cache=cache)[:, -1, :]

    def clear_cache(self) -> None:
        """Core's ``clear_cache`` (for after the model's weights changed), once the model's
        arrays are evaluated on the calling thread: weights the caller changed
        (``model.update``, ``load_weights``) are lazy arrays of its thread, which MLX 0.30
        and later refuses to evaluate on the worker (every request failed with "There is
        no Stream(cpu, 0) in current thread")."""
        model = self.model  # None once closed: core's clear then has nothing to do
        if model is not None:
            _materialize(model)
        super().clear_cache()

    def clear_kv_cache(self) -> None:
        """Drop every cached prefix KV and the live batch, and hand MLX's freed buffers
        back (output rows stay cached); after close, nothing to do (the release dropped
        it)."""
        try:
            self.worker.call(self._clear_backend_cache)
        except ModelClosedError:
            pass

    def _clear_backend_cache(self) -> None:
        """The KV, then MLX's buffer cache: the freed arrays' memory would otherwise stay
        with MLX for reuse (genlm-backend 0.3's ``clear_cache`` frees it too)."""
        self.kv_cache.clear()
        mx.clear_cache()

    def _close_backend(self) -> None:
        """Drop the KV and the model, then MLX's buffer cache: a closed model's weights are
        freed once nothing else holds them (a ``from_name`` model's at once), though the
        closed object is still referenced (after ``async with``)."""
        self.kv_cache.clear()
        # The model may be the caller's: it gets its own layers back (it kept computing
        # the adapter on it), and the adapters' arrays go, before MLX's cache is cleared
        # (core forgets the adapters after the release too, too late for that).
        self._unwrap_layers()
        self.model = None
        self.adapters.clear()
        mx.clear_cache()


def _accepted(logprobs: mx.array) -> list[bool]:
    """Which rows core accepts (a row holding NaN or +inf, or -inf everywhere, fails its
    batch; -inf alone is an impossible token's): only their KV is worth keeping."""
    return mx.isfinite(mx.max(logprobs, axis=-1)).tolist()


def _log_softmax(logits: mx.array) -> mx.array:
    """Row-wise log-softmax in float32 (bf16 logits are upcast first)."""
    logits = logits.astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _in_order(groups: list[list[int]], outputs: list[mx.array]) -> mx.array:
    """Per-group outputs (``outputs[g][k]`` answers ``groups[g][k]``) as rows in request order."""
    order = [i for group in groups for i in group]
    rows = outputs[0] if len(outputs) == 1 else mx.concatenate(outputs)
    if order == list(range(len(order))):
        return rows
    return rows[mx.array(np.argsort(order))]


def _check_model(model: Any) -> None:
    """Reject anything but a loaded mlx-lm model (an ``nn.Module`` with ``make_cache`` or
    ``layers``, what mlx-lm's ``make_prompt_cache`` reads), pointing a name or path to
    :meth:`MLXLM.from_name`."""
    if isinstance(model, nn.Module) and (hasattr(model, "make_cache") or hasattr(model, "layers")):
        return
    name = repr(os.fspath(model)) if isinstance(model, (str, os.PathLike)) else "name"
    raise TypeError(
        f"cannot wrap {type(model).__qualname__} ({type(model).__module__}); expected a loaded "
        "mlx-lm model (an mlx.nn.Module with layers, as mlx_lm.load(path)[0] returns): "
        f"MLXLM.from_name({name}) loads one by name, path or Hub id"
    )


def _materialize(model: nn.Module) -> None:
    """Evaluate every array of ``model`` here, so the worker thread can use them."""
    arrays = [v for _, v in tree_flatten(model) if isinstance(v, mx.array)]
    try:
        mx.eval(arrays)
    except RuntimeError as exc:
        if "Stream" not in str(exc):
            raise
        raise RuntimeError(
            "the MLX model holds lazy arrays built on another thread; construct MLXLM, or "
            "call clear_cache after changing its weights, on the thread that built them "
            "(or evaluate them there: mx.eval(model.parameters()))"
        ) from exc


def _text_args(model: Any) -> list[Any]:
    """Where an mlx-lm model states its language model's arguments, in lookup order.

    Models that wrap a language model (qwen2_vl, qwen3_vl, qwen3_5_moe, mistral3, pixtral,
    lfm2-vl) keep its vocabulary size and maximum positions in ``args.text_config`` (a dict,
    or an object), not in ``args``: it comes first where present, as transformers'
    ``get_text_config()``, then ``args`` itself.
    """
    args = getattr(model, "args", None)
    return [source for source in (getattr(args, "text_config", None), args) if source is not None]


def _positive_arg(sources: list[Any], *names: str) -> int | None:
    """The first of ``names`` that ``sources`` (dicts or objects, in order) set to a
    positive integer, or None."""
    for source in sources:
        for name in names:
            value = source.get(name) if isinstance(source, dict) else getattr(source, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _max_positions(sources: list[Any]) -> int | None:
    """The maximum positions in an mlx-lm model's arguments (:func:`_text_args`), or None
    where they name none.

    Most mlx-lm models call it ``max_position_embeddings``; GPT-2 style models
    (learned position embeddings) ``n_positions``.
    """
    return _positive_arg(sources, "max_position_embeddings", "n_positions")


def _unwrap(tokenizer: Any) -> Any:
    """The transformers tokenizer inside mlx-lm's ``TokenizerWrapper`` (or ``tokenizer`` itself).

    The wrapper only forwards attribute lookups, so core's vocabulary reader cannot
    recognise it; mlx-lm keeps the wrapped tokenizer in ``_tokenizer``.
    """
    return getattr(tokenizer, "_tokenizer", tokenizer)
