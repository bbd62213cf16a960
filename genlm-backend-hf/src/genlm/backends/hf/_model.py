"""``HFLM``: a Hugging Face transformers causal LM behind GenLM's batched, cached interface.

Core owns validation, batching, the output cache and sampling; this module owns the forward
pass and KV reuse (see ``_kv``): every request resumes from the longest cached prefix of its
context, with no call from the user, so a batch of particles that each extend a cached
context by one token runs one new token per particle.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import itertools
import logging
from collections.abc import Collection, Hashable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np
import torch

from genlm.backends.hf._kv import (
    SEGMENT_OVERHEAD_BYTES,
    BatchInputs,
    BufferedCache,
    KVShape,
    KVStore,
    Row,
    group_rows,
    layer_tensors,
)
from genlm.core import ModelClosedError, Vocabulary
from genlm.core.backend import (
    CURRENT_VARIANT,
    BatchedLM,
    LoraAdapters,
    ResidentRows,
    checked_count,
    plan_rows,
    resolve_model_path,
)

logger = logging.getLogger(__name__)

#: Default byte budget of the KV cache.
DEFAULT_KV_CACHE_BYTES = 1 << 30
#: Padded new tokens per forward pass, at most (rows beyond it go to another pass, a longer
#: context's new tokens run in several passes).
DEFAULT_MAX_FORWARD_TOKENS = 4096
#: The batch KV buffer is kept between batches up to this size (larger ones are freed).
_KEEP_BUFFER_BYTES = 512 << 20


class HFLM(LoraAdapters, BatchedLM):
    """A transformers causal LM with automatic KV reuse and LoRA adapters.

    Args:
        model: a loaded ``PreTrainedModel`` for causal LM (or a peft ``PeftModel``).
        tokenizer: its tokenizer, read into the vocabulary. Rows are as wide as the model's
            logits (its output embeddings); logit rows a checkpoint pads beyond the tokenizer
            (Qwen2: 151936 for 151665 tokens) are unused ids with no bytes, and rows are
            normalized over the full width, as the other backends and genlm-backend 0.3.1
            do. A tokenizer with more tokens than the model has logits is a ``ValueError``.
        kv_cache_bytes: byte budget of the KV cache (LRU-evicted; pinned prompts stay).
            Outside it: the batch buffer a forward pass gathers its rows' KV into, of
            ``shape.bytes_per_token`` times its rows (at most ``max_batch_size``) times its
            longest context with room to grow, kept between batches up to 512 MiB (a larger
            one is freed after its batch); ``clear_kv_cache`` and ``clear_cache`` release it.
        max_forward_tokens: most padded new tokens (rows times the widest row's new tokens)
            in one forward pass; it bounds the activations and logits of a pass, not the KV.
            Rows beyond it go to another pass, and a context with more new tokens than this
            (a long prompt) runs in successive passes, each resuming from the KV of the last.
        device_rows: hand rows to core as float32 torch tensors on the model's device (no
            host round trip: ``output="torch"`` callers get them without a copy, numpy
            callers get one transfer per row). ``False``: rows cross to the host as numpy
            arrays, as before. ``None`` (default): torch rows when the model is not on the
            CPU. On the CPU numpy is kept by default: the numpy callers (genlm-bytes, the
            trie, core's default) then pay nothing, where a torch row costs them a ~5 us
            view per read; torch callers pay one row copy per read instead.
        kv_length_multiple: attend over a KV length rounded up to a multiple of this (the
            extra columns lie after every query, so the causal mask hides them), so that
            successive SMC steps, whose contexts grow by a token, run the same shapes: shape
            caches (cuDNN plans, compiled kernels) are reused instead of rebuilt every step.
            ``None`` (default): 64 off the CPU, 1 (exact lengths) on the CPU, where extra
            columns are pure extra work and nothing is cached per shape.
        sdpa_backends: the scaled-dot-product-attention kernels torch may use for this
            model's forward passes, in priority order, from ``"efficient"``, ``"flash"``,
            ``"math"``, ``"cudnn"`` (``torch.nn.attention.sdpa_kernel``; it matters for
            models loaded with ``attn_implementation="sdpa"``, transformers' default).
            ``None`` (default): on CUDA ``("efficient", "flash", "math")``, never cuDNN,
            which builds a plan per new sequence length (measured ~70 ms per SMC step on
            an H100, issue 14); elsewhere torch's own choice.
        **kwargs: scheduler and output-cache options of :class:`genlm.core.backend.BatchedLM`;
            ``max_context_length`` defaults to the model's ``max_position_embeddings``
            (None where its configuration names no limit; pass None to lift it).
    """

    #: Each batch is a fresh ``log_softmax`` output: core keeps it without a copy.
    stable_batches = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES,
        max_forward_tokens: int = DEFAULT_MAX_FORWARD_TOKENS,
        device_rows: bool | None = None,
        kv_length_multiple: int | None = None,
        sdpa_backends: Sequence[str] | None = None,
        **kwargs: Any,
    ):
        if not (isinstance(model, torch.nn.Module) and hasattr(model, "config")):
            raise TypeError(
                f"HFLM takes a transformers model (a torch module with a config), got "
                f"{type(model).__name__}; to load one by name use HFLM.from_name(name)"
            )
        max_forward_tokens = checked_count("max_forward_tokens", max_forward_tokens, 1)
        if device_rows is not None and not isinstance(device_rows, bool):
            raise TypeError(f"device_rows must be True, False or None, got {device_rows!r}")
        if kv_length_multiple is not None:
            kv_length_multiple = checked_count("kv_length_multiple", kv_length_multiple, 1)
        backends = None if sdpa_backends is None else _sdpa_backends(sdpa_backends)
        vocab = _vocabulary(model, tokenizer)
        _check_full_attention(model.config)
        #: Whether only rows that add the same number of tokens share a forward, so that
        #: no padding separates a row's past from its new tokens and no fresh row is
        #: padded: where the model's attention depends on how far apart two columns of the
        #: KV buffer are (see :func:`_attends_by_column`), and where a padded query may be
        #: NaN (float64 without SDPA, see :func:`_pads_to_nan`).
        self._equal_new = _attends_by_column(model.config) or _pads_to_nan(model)
        kwargs.setdefault("name", getattr(model, "name_or_path", None) or type(model).__name__)
        kwargs.setdefault("max_context_length", _max_positions(model.config))
        super().__init__(vocab, tokenizer, **kwargs)
        self.model = model.eval()
        self.max_forward_tokens = max_forward_tokens
        self.kv = KVStore(checked_count("kv_cache_bytes", kv_cache_bytes, 0, whole_floats=True))
        #: Counters for tests and benchmarks: tokens run through the model (padding excluded),
        #: tokens whose KV came from the cache, forward passes, and rows whose past was still
        #: in place in the batch buffer (no copy).
        self.kv_stats = {
            "computed_tokens": 0,
            "reused_tokens": 0,
            "forwards": 0,
            "resident_rows": 0,
        }
        self._pad_id = _pad_id(tokenizer, len(vocab))
        forward = inspect.signature(_base_model(model).forward).parameters
        #: Whether the forward computes the last position's logits alone (transformers >= 4.50).
        self._keeps_last_logits = "logits_to_keep" in forward
        #: The forward's name for the KV cache, also its output's: ``cache`` where the forward
        #: takes it (transformers 5.2x deprecate ``past_key_values``, to be removed in 5.40).
        self._cache_argument = "cache" if "cache" in forward else "past_key_values"
        #: ``[layers, 2, rows, kv_heads, columns, head_dim]``, kept between batches: a batch
        #: uses a view of its first rows and columns, and rows that extend the same row of the
        #: previous batch find their past already in place (see ``_resident_rows``).
        self._buffer: torch.Tensor | None = None
        self._resident: _Resident | None = None
        # ``adapters`` holds an ``_Adapter`` for each loaded adapter (the base model's KV
        # marker is -1).
        self._peft: Any = model if _is_peft(model) else None
        #: A caller's PeftModel as it came (its adapters' names, its active one), to give it
        #: back so at close; None while ``_peft`` is the wrapper add_lora put around the
        #: caller's plain model (or there is none).
        self._given: tuple[frozenset[str], Any] | None = None
        if self._peft is not None:
            for name in self._peft.peft_config:
                self.adapters.add(name, _Adapter(self.adapters.new_marker(), name))
            self.adapters.active = getattr(self._peft, "active_adapter", None)
            self._given = (frozenset(self._peft.peft_config), self.adapters.active)
        try:
            self.shape: KVShape = self.worker.call(self._probe)
        except BaseException:  # a model whose forward fails: stop the worker now, not at GC
            self.close()
            raise
        #: Whether rows are handed to core as torch tensors on :attr:`device` (see
        #: ``device_rows``); genlm-bytes reads it to keep its masses there too.
        self.device_rows: bool = self.device.type != "cpu" if device_rows is None else device_rows
        on_cpu = self.device.type == "cpu"
        #: The KV length bucket (see ``kv_length_multiple``); 1 means exact lengths.
        self.kv_length_multiple: int = kv_length_multiple or (1 if on_cpu else 64)
        #: The attention kernels allowed, in priority order (None: torch's choice).
        self.sdpa_backends: tuple[Any, ...] | None = (
            backends if sdpa_backends is not None else _default_sdpa_backends(self.device)
        )

    @property
    def device(self) -> torch.device:
        """Where the model's KV lives and its rows are computed."""
        return self.shape.device

    # ---- loading -------------------------------------------------------------------

    @classmethod
    def from_name(
        cls,
        model_id: str,
        hf_opts: dict[str, Any] | None = None,
        *,
        load_in_8bit: bool = False,
        load_in_4bit: bool = False,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype = "auto",
        kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES,
        **kwargs: Any,
    ) -> HFLM:
        """Load a model and tokenizer by Hub id or local directory (``"stories260K"`` is embedded).

        ``hf_opts`` go to ``AutoModelForCausalLM.from_pretrained``. ``device`` defaults to
        ``cuda`` when available, else ``cpu``; ``dtype="auto"`` keeps the checkpoint's.
        ``load_in_8bit`` or ``load_in_4bit`` (one at most) quantize the weights with
        bitsandbytes and place the model by ``device_map``, so they need bitsandbytes and
        accelerate (as does a ``BitsAndBytesConfig`` passed as ``hf_opts``'
        ``quantization_config``). The other options are :class:`HFLM`'s; ``name`` defaults
        to ``model_id``.

        Raises:
            ValueError: both ``load_in_8bit`` and ``load_in_4bit``.
            ImportError: bitsandbytes quantization without bitsandbytes or accelerate (the
                message names the ``pip install`` of both).
        """
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model_path(model_id)
        opts = dict(hf_opts or {})
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if load_in_8bit and load_in_4bit:
            raise ValueError("choose one of load_in_8bit and load_in_4bit")
        quantized = load_in_8bit or load_in_4bit
        if quantized or isinstance(
            opts.get("quantization_config"), transformers.BitsAndBytesConfig
        ):
            _check_bitsandbytes_installed()
        if quantized:
            opts["quantization_config"] = transformers.BitsAndBytesConfig(
                load_in_8bit=load_in_8bit, load_in_4bit=load_in_4bit
            )
            opts.setdefault("device_map", str(device))
        new_api = _transformers_at_least(transformers.__version__, 4, 56)
        dtype_key = "dtype" if new_api else "torch_dtype"
        opts.setdefault(dtype_key, dtype if dtype == "auto" else _torch_dtype(dtype))
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **opts)
        if "device_map" not in opts:
            model = model.to(device)
        kwargs.setdefault("name", str(model_id))
        return cls(model, tokenizer, kv_cache_bytes=kv_cache_bytes, **kwargs)

    def _probe(self) -> KVShape:
        """Run one token to learn the KV geometry (and fail early on unsupported caches, or
        logits of another width than the vocabulary's)."""
        device = _model_device(self.model)
        ids = torch.tensor([[self._pad_id]], device=device)
        with torch.inference_mode():
            out = self.model(input_ids=ids, use_cache=True)
        if out.logits.shape[-1] != len(self.vocab):  # a model without an output head
            raise ValueError(
                f"the model computes {out.logits.shape[-1]} logits but its vocabulary has "
                f"{len(self.vocab)} ids (the width of its output embeddings, or the "
                "tokenizer's size for a model without them)"
            )
        layers = layer_tensors(getattr(out, self._cache_argument))
        shapes = {tuple(k.shape[1:2]) + tuple(k.shape[3:]) for k, _ in layers}
        shapes |= {tuple(v.shape[1:2]) + tuple(v.shape[3:]) for _, v in layers}
        if len(shapes) != 1:
            raise NotImplementedError(
                f"layers with different KV shapes {sorted(shapes)} are not supported "
                "by the hf backend"
            )
        (heads, head_dim), (keys, _) = shapes.pop(), layers[0]
        return KVShape(len(layers), heads, head_dim, keys.dtype, keys.device)

    # ---- LoRA ------------------------------------------------------------------------

    def add_lora(self, path: str, name: str, *, replace: bool = False) -> None:
        """Load the peft adapter saved at ``path`` as ``name``; it does not become active.

        With ``replace``, an adapter loaded as ``name`` is replaced once the new one has
        loaded (see :meth:`genlm.core.backend.LoraAdapters.add_lora`): a path that holds
        no adapter, or one of another model, leaves it loaded.

        Raises:
            ValueError: an adapter named ``name`` is already loaded (without ``replace``;
                checked on the worker, so of two callers loading one name, one gets it and
                the other this error).
        """
        if importlib.util.find_spec("peft") is None:
            raise ImportError("LoRA adapters need peft: pip install 'genlm-backend-hf[lora]'")
        super().add_lora(str(path), name, replace=replace)

    def _load_adapter(self, path: str, name: str) -> _Adapter:
        """Load the adapter into peft, under ``name`` unless peft holds an adapter of that
        name (the one a replacement replaces): then beside it, under a name of its own."""
        from peft import PeftModel

        if self._peft is None:
            # peft puts its layers into the model itself before it loads the adapter's
            # weights: an adapter that fails to load (shapes of another model) would stay
            # in the base model's forward, so the model's layers are put back then.
            layers, attributes = _submodules(self.model), set(vars(self.model))
            try:
                self._peft = PeftModel.from_pretrained(self.model, path, adapter_name=name).eval()
            except BaseException:
                _restore_submodules(layers)
                for attribute in set(vars(self.model)) - attributes:  # peft's peft_config
                    delattr(self.model, attribute)
                raise
            self.model = self._peft
            return _Adapter(self.adapters.new_marker(), name)
        peft_name = _free_name(name, self._peft.peft_config)
        try:
            self._peft.load_adapter(path, adapter_name=peft_name)
        except BaseException:
            # peft adds the adapter's layers and config before its weights: one that fails
            # to load (shapes of another model) would stay in peft, inactive.
            if peft_name in self._peft.peft_config:
                self._peft.delete_adapter(peft_name)
            raise
        return _Adapter(self.adapters.new_marker(), peft_name)

    def _release_adapter(self, name: str, adapter: _Adapter) -> None:
        """Unload the removed adapter from peft and drop its KV, pinned prompts included."""
        if len(self._peft.peft_config) == 1:  # the last one: back to the plain model (a
            self.model = self._peft.unload()  # PeftModel without adapters cannot run)
            self._peft = self._given = None  # a caller's PeftModel is unloaded too
        else:
            # Another one active first: peft warns when deleting its active adapter (naming
            # it as peft does, a replacement's "a#2").
            others = [n for n in self._peft.peft_config if n != adapter.peft_name]
            self._peft.set_adapter(others[0])
            self._peft.delete_adapter(adapter.peft_name)
        self.kv.cache.remove_below((adapter.marker,))

    @contextlib.contextmanager
    def _use_variant(self, variant: Hashable) -> Iterator[None]:
        """Activate the adapter a batch was requested with (the base model for None)."""
        if self._peft is None:
            yield
        elif variant is None:
            with self._peft.disable_adapter():
                yield
        else:
            self._peft.set_adapter(self.adapters.get(variant).peft_name)
            yield

    def _marker(self, variant: Hashable) -> int:
        """The first key element of a variant's KV entries: adapters never share KV.

        Raises:
            UnknownVariantError: the adapter was removed after the request was made.
        """
        return -1 if variant is None else self.adapters.get(variant).marker

    # ---- KV cache management -------------------------------------------------------

    def cache_kv(
        self, prompt_token_ids: Sequence[int], variant: Hashable = CURRENT_VARIANT
    ) -> None:
        """Compute and pin the KV of a prompt under the active adapter (never evicted), or
        under the adapter ``variant`` names (None: the base model), as requests take it.

        Blocks until the prompt's KV is computed (when not already cached) and pinned;
        :meth:`clear_kv_cache` unpins it. ``MemoryError`` when it does not fit in
        ``kv_cache_bytes``, alone or beside the prompts already pinned (then nothing of it
        is pinned).
        """
        variant, context = self.validate_request(prompt_token_ids, variant)
        self.worker.call(self._cache_kv, variant, context)

    def _cache_kv(self, variant: Hashable, context: tuple[int, ...]) -> None:
        marker = self._marker(variant)
        if sum(used for _, used in self.kv.chain(marker, context, len(context))) < len(context):
            self._logprobs_batch([context], variant)
        if not self.kv.pin_chain(marker, context):  # nothing pinned
            # At least one segment: its tensors and its bookkeeping.
            needed = len(context) * self.shape.bytes_per_token + SEGMENT_OVERHEAD_BYTES
            budget = self.kv.cache.max_bytes
            why = (
                "does not fit in"
                if needed > budget
                else "does not fit beside the prompts already pinned (clear_kv_cache unpins "
                "them) in"
            )
            raise MemoryError(
                f"the KV of a {len(context)}-token prompt ({needed} bytes) {why} "
                f"kv_cache_bytes={budget}"
            )

    def clear_kv_cache(self) -> None:
        """Drop every cached KV entry, pinned prompts included, and the batch KV buffer
        kept between batches (outside ``kv_cache_bytes``); after close, nothing to do (the
        release dropped them), as for ``clear_cache``."""
        try:
            self.worker.call(self._drop_kv, False)
        except ModelClosedError:
            pass

    def _clear_backend_cache(self) -> None:
        """``clear_cache`` drops unpinned KV and the batch buffer; prompts pinned by
        ``cache_kv`` stay."""
        self._drop_kv(keep_pinned=True)

    def _drop_kv(self, keep_pinned: bool) -> None:
        """Drop the cached KV (but the pinned prompts, with ``keep_pinned``) and the batch
        buffer, whose memory a clear must release too (worker thread)."""
        self.kv.clear(keep_pinned=keep_pinned)
        self._buffer = self._resident = None

    def _close_backend(self) -> None:
        """Drop the KV, the batch buffer and the model (with its adapters): a closed model's
        weights are freed once nothing else holds them (a ``from_name`` model's at once)."""
        self._drop_kv(keep_pinned=False)
        if self._peft is not None:
            self._give_back()
        self.model = self._peft = None

    def _give_back(self) -> None:
        """Leave the model the caller handed over computing what it did before: peft's
        layers taken out of a plain model (as removing the last adapter does), or a
        PeftModel rid of the adapters loaded here, its own active one on again."""
        if self._given is None:
            self._peft.unload()
        else:
            names, active = self._given
            if active in self._peft.peft_config:  # first: peft warns when deleting its active
                self._peft.set_adapter(active)
            for name in [n for n in self._peft.peft_config if n not in names]:
                self._peft.delete_adapter(name)

    # ---- the forward pass ----------------------------------------------------------

    def _logprobs_batch(
        self, contexts: list[tuple[int, ...]], variant: Hashable
    ) -> np.ndarray | torch.Tensor:
        """The batch's rows: a float32 tensor on :attr:`device` (``device_rows``), else numpy."""
        marker = self._marker(variant)

        def lookup(context: tuple[int, ...], limit: int) -> tuple[int, list]:
            pieces = self.kv.chain(marker, context, limit)
            return sum(used for _, used in pieces), pieces

        rows = plan_rows(contexts, lookup)
        groups = group_rows(rows, self.max_forward_tokens, self._equal_new)
        with torch.inference_mode(), self._use_variant(variant):
            results = [self._forward(group, marker) for group in groups]
        order = [row.index for group in groups for row in group]
        out = results[0] if len(results) == 1 else torch.cat(results)
        if order != sorted(order):  # rows come grouped; put them back in request order
            out = out[torch.tensor(order, device=out.device).argsort()]
        # Core copies each row once either way (so a cached row owns its memory); on the CPU
        # ``.numpy()`` is a view, elsewhere one transfer for the whole batch.
        return out if self.device_rows else out.cpu().numpy()

    def _forward(self, rows: list[Row], marker: int) -> torch.Tensor:
        """Rows with cached pasts, padded into one batch; stores their new KV.

        The new tokens run in passes of at most ``max_forward_tokens`` padded tokens, each
        resuming from the KV the previous one wrote into the buffer (a chunked prefill).
        """
        past, new = max(r.past for r in rows), max(r.new for r in rows)
        buffer, resident = self._batch_buffer(rows, marker, past, new, self._bucket(past + new))
        batch = BatchInputs(rows, buffer[..., : past + new, :], self._pad_id)
        # The kept buffer is about to be overwritten (pasts, then new KV): forget what it
        # held now, so a forward that fails (e.g. out of memory) leaves no stale record.
        # Only a successful pass records its rows again.
        self._resident = None
        batch.fill_past(skip=resident)
        self.kv_stats["resident_rows"] += len(resident)
        kwargs = {"logits_to_keep": 1} if self._keeps_last_logits else {}
        for start, end in batch.chunks(self.max_forward_tokens):
            written, columns = past + end, self._bucket(past + end)
            if past + start == 0 and end - start == 1:
                # One query with no past: transformers 5 drops a mask that only hides
                # columns after it and relies on SDPA's is_causal, which it leaves off for
                # one query, so bucket columns would be attended. Such a pass is one column.
                columns = written
            if columns > written:  # attended but masked: 0 weight * NaN would be NaN
                buffer[..., written:columns, :].zero_()
            with self._attention_kernels():
                output = self.model(
                    **batch.model_inputs(start, end, columns),
                    **{self._cache_argument: BufferedCache(buffer, past + start, columns)},
                    use_cache=True,
                    **kwargs,
                )
            self.kv_stats["forwards"] += 1
        logits = output.logits[:, -1]
        # Normalize in at least float32 (bf16 logits would lose small probabilities).
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        logprobs = torch.log_softmax(logits, dim=-1).float()
        # A row core refuses (NaN, +inf, every token -inf: its batch fails) keeps no KV and
        # no resident record: its KV may be NaN, and every continuation would resume from
        # it. (-inf alone is an impossible token's log-probability: such rows are kept.)
        finite = torch.isfinite(logprobs.amax(dim=-1)).tolist()
        for i, row in enumerate(rows):
            if finite[i]:
                self.kv.store(marker, row, lambda start, i=i: batch.row_kv(i, start))
        if self._buffer is not None and buffer.data_ptr() == self._buffer.data_ptr():
            # A row's tokens are contiguous unless padding separates its past and new ones.
            contiguous = [
                r.context if finite[i] and (r.past == 0 or r.new == new) else None
                for i, r in enumerate(rows)
            ]
            self._resident = _Resident(marker, ResidentRows(contiguous), past + new)
        self.kv_stats["computed_tokens"] += sum(r.new for r in rows)
        self.kv_stats["reused_tokens"] += sum(r.past for r in rows)
        return logprobs

    def _bucket(self, length: int) -> int:
        """``length`` rounded up to a multiple of :attr:`kv_length_multiple`."""
        return -(-length // self.kv_length_multiple) * self.kv_length_multiple

    def _attention_kernels(self) -> contextlib.AbstractContextManager:
        """Restrict torch's attention kernels to :attr:`sdpa_backends` for one forward."""
        if self.sdpa_backends is None:
            return contextlib.nullcontext()
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel(list(self.sdpa_backends), set_priority=True)

    def _batch_buffer(
        self, rows: list[Row], marker: int, past: int, new: int, columns: int
    ) -> tuple[torch.Tensor, frozenset[int]]:
        """The KV buffer view for a batch (``columns`` wide), and the rows whose past it holds.

        The buffer is not initialized: every column a pass attends is written first (the
        pasts and their padding by ``fill_past``, the new tokens by the pass, the bucket's
        extra columns zeroed by ``_forward``).
        """
        shape = self.shape
        b, t = len(rows), past + new
        kept = self._buffer
        if kept is None or kept.shape[2] < b or kept.shape[4] < columns:
            # Headroom in columns: contexts grow by a token per step, and a fresh buffer
            # costs page faults and loses the resident rows.
            rows_cap = max(b, 0 if kept is None else kept.shape[2])
            width = max(columns, t + max(64, t // 4))
            dims = (shape.layers, 2, rows_cap, shape.kv_heads, width, shape.head_dim)
            self._buffer = self._resident = None
            if int(np.prod(dims)) * shape.dtype.itemsize > _KEEP_BUFFER_BYTES:
                dims = (shape.layers, 2, b, shape.kv_heads, columns, shape.head_dim)
                return torch.empty(dims, dtype=shape.dtype, device=shape.device), frozenset()
            kept = self._buffer = torch.empty(dims, dtype=shape.dtype, device=shape.device)
        return kept[:, :, :b, :, :columns], self._resident_rows(rows, marker, past)

    def _resident_rows(self, rows: list[Row], marker: int, past: int) -> frozenset[int]:
        """Rows whose whole past sits, right-aligned at column ``past``, in the kept buffer.

        That is row ``i`` of this batch extending exactly row ``i`` of the previous one, whose
        tokens ended at the column where this batch's past ends (the SMC pattern: each
        particle extends itself by a token per step). Their past needs no copying.
        """
        last = self._resident
        if last is None or last.marker != marker or last.columns != past:
            return frozenset()
        holds = last.rows.holds
        return frozenset(i for i, row in enumerate(rows) if holds(i, row.context, row.past))


@attrs.frozen
class _Adapter:
    """A loaded adapter: its KV marker (the first element of its KV keys) and its name in
    peft, the adapter's own name unless a replacement loaded it beside the adapter it
    replaced."""

    marker: int
    peft_name: str


def _free_name(name: str, taken: Collection[str]) -> str:
    """``name``, or the first of ``name#2``, ``name#3``, ... not in ``taken``."""
    candidates = itertools.chain([name], (f"{name}#{i}" for i in itertools.count(2)))
    return next(n for n in candidates if n not in taken)


@attrs.frozen
class _Resident:
    """What the kept KV buffer holds after a batch: each row's context, ending at ``columns``.

    Rows whose past and new tokens are not contiguous (padding between them) hold None.
    """

    marker: int
    rows: ResidentRows
    columns: int


#: ``sdpa_backends`` names -> ``torch.nn.attention.SDPBackend`` member names.
_SDPA_BACKENDS = {
    "efficient": "EFFICIENT_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "math": "MATH",
    "cudnn": "CUDNN_ATTENTION",
}


def _check_bitsandbytes_installed() -> None:
    """bitsandbytes quantization needs bitsandbytes and accelerate (transformers places a
    quantized model by ``device_map``, which is accelerate's): one error naming both and
    the one command, where transformers asked for them one install at a time.

    Raises:
        ImportError: either is not installed (the message says which).
    """
    missing = [m for m in ("bitsandbytes", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            "bitsandbytes quantization (load_in_8bit, load_in_4bit, a BitsAndBytesConfig) needs "
            f"bitsandbytes and accelerate, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: "
            "pip install bitsandbytes accelerate"
        )


def _sdpa_backends(names: Sequence[str]) -> tuple[Any, ...]:
    """``SDPBackend`` members for ``names``; raises ``ValueError`` on unknown or no names."""
    from torch.nn.attention import SDPBackend

    if isinstance(names, str):
        names = (names,)
    unknown = [n for n in names if n not in _SDPA_BACKENDS]
    if unknown or not names:
        raise ValueError(
            f"sdpa_backends must name some of {sorted(_SDPA_BACKENDS)}, got {list(names)!r}"
        )
    return tuple(getattr(SDPBackend, _SDPA_BACKENDS[n]) for n in names)


def _default_sdpa_backends(device: torch.device) -> tuple[Any, ...] | None:
    """On CUDA every kernel but cuDNN's (a plan per sequence length); elsewhere torch's choice."""
    return _sdpa_backends(("efficient", "flash", "math")) if device.type == "cuda" else None


def _submodules(model: Any) -> list[tuple[Any, str, Any]]:
    """Every ``(module, child name, child)`` edge of ``model``'s module tree (references only:
    no weights are copied), for :func:`_restore_submodules`."""
    return [
        (module, child_name, child)
        for module in model.modules()
        for child_name, child in module._modules.items()
    ]


def _restore_submodules(edges: list[tuple[Any, str, Any]]) -> None:
    """Put every child of :func:`_submodules` back where it was (a module a library swapped
    in, such as a LoRA layer, is dropped with its weights); the weights themselves were
    never changed."""
    for module, child_name, child in edges:
        if module._modules.get(child_name) is not child:
            module._modules[child_name] = child


def _is_peft(model: Any) -> bool:
    return type(model).__module__.startswith("peft")


def _base_model(model: Any) -> Any:
    return model.get_base_model() if _is_peft(model) else model


def _logit_width(model: Any) -> int | None:
    head = _base_model(model).get_output_embeddings()
    return None if head is None else int(head.weight.shape[0])


def _vocabulary(model: Any, tokenizer: Any) -> Vocabulary:
    """The tokenizer's vocabulary, as wide as the model's logit rows.

    Checkpoints pad their output head beyond the tokenizer (Qwen2: 151936 logits for 151665
    tokens): the padding ids are unused (no bytes) and rows are normalized over the full
    width, as the other backends and genlm-backend 0.3.1 do, so one checkpoint gives the
    same rows everywhere. Tokens added to the tokenizer past the model's embeddings (GPT-2
    given a pad token, Gemma 3) are left out with a warning (the model can neither read nor
    predict them); a tokenizer whose own tokens go past them is refused. A model without an
    output-embedding head keeps the tokenizer's size (the probe checks that its logits are
    that wide). The EOS ids are the tokenizer's and those of the model's generation
    configuration (what ``generate`` stops on; see
    :meth:`~genlm.core.Vocabulary.with_model_eos`).
    """
    width = _logit_width(model)
    own = getattr(tokenizer, "vocab_size", None)  # transformers: without added tokens
    if width is not None and isinstance(own, int) and own > width:
        raise ValueError(
            f"the model has {width} output logits but its tokenizer has {own} tokens of its "
            "own; pass the tokenizer that belongs to this model"
        )
    vocab = Vocabulary.from_tokenizer(tokenizer, size=width)
    generation = getattr(_base_model(model), "generation_config", None)
    return vocab.with_model_eos(getattr(generation, "eos_token_id", None))


def _check_full_attention(config: Any) -> None:
    """Reject models whose layers are not all full attention (sliding windows, linear attention)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise NotImplementedError(
            "the hf backend reuses KV for full-attention layers only; "
            f"this model has {sorted(kinds)}"
        )


def _pads_to_nan(model: Any) -> bool:
    """Whether a padding query with every column masked may come out NaN: in a float64
    model whose attention is not torch's SDPA. Padding left of a fresh row's first token
    (no past) sees only padding; attention that takes its softmax in float32 (transformers'
    eager attention, Bloom's, CodeGen's on 4.57) casts float64's mask minimum to -inf there,
    and the softmax of a row of -inf is NaN, which the next layer's values carry to every
    position of the row (NaN times weight 0 is NaN). In float32 and half precision the
    minimum stays finite, and SDPA computes in the model's dtype: such a query attends to
    padding whose result nobody reads."""
    attention = getattr(model.config, "_attn_implementation", None)
    return getattr(model, "dtype", None) == torch.float64 and attention != "sdpa"


def _attends_by_column(config: Any) -> bool:
    """Whether the model masks or biases attention by the distance between KV buffer
    columns rather than by positions: a sliding window that ``layer_types`` does not
    describe (Mistral-style ``sliding_window``; its mask counts columns), or ALiBi
    computed from column indices (MPT). Padding between a row's past and its new tokens
    would change what such a model computes. (Bloom builds ALiBi from the attention mask:
    padding is harmless there.)"""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    attn_config = getattr(text, "attn_config", None)
    return bool(
        getattr(text, "sliding_window", None)
        or getattr(text, "alibi", False)
        or getattr(attn_config, "alibi", False)
    )


#: Where configurations state the model's maximum positions: ``max_position_embeddings``
#: is the transformers name (configs with another name, such as GPT-2's ``n_positions``,
#: map it through their ``attribute_map``); MPT's ``max_seq_len`` is not mapped.
_MAX_POSITIONS_NAMES = ("max_position_embeddings", "max_seq_len")


def _max_positions(config: Any) -> int | None:
    """The model's maximum positions, or None where its configuration names none (models
    without position limits: state-space models, Bloom's ALiBi)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in _MAX_POSITIONS_NAMES:
        value = getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _pad_id(tokenizer: Any, size: int) -> int:
    """The id that fills padding: the tokenizer's pad, EOS or BOS id, the first that is a
    token of the model's ``size`` (a pad token added past its embeddings is not)."""
    for attr in ("pad_token_id", "eos_token_id", "bos_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int) and 0 <= value < size:
            return value
    return 0


def _model_device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use 'auto', 'float32', 'bfloat16', ...")
    return value


def _transformers_at_least(version: str, major: int, minor: int) -> bool:
    parts = version.split(".")
    return (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)) >= (major, minor)
