"""The language-model classes of genlm-backend 0.3, as thin facades over genlm-core models.

Each concrete class wraps one core model (a :class:`genlm.core.backend.BatchedLM` of a
backend plugin) and exposes it as ``core_lm``. Everything is the core model's: the scheduler
(autobatching), the output cache, the KV reuse, the worker thread. The facade converts
arguments (``lora_name`` becomes core's per-request ``variant``, ``batch_size``/``timeout``
become ``max_batch_size``/``max_wait_s``) and asks core for torch rows (``output="torch"``:
float32 tensors on the device the backend computed them on) unless the caller names another
``output``: a facade model is itself a :class:`genlm.core.AsyncLM`.

0.3's documented modules ``genlm.backend.llm.base``, ``.hf``, ``.vllm`` and ``.mlx`` hold
the same classes.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator, Sequence
from types import ModuleType
from typing import Any, Self

import numpy as np
import torch

from genlm.backend.tokenization import (
    _check_exact,
    _read_vocab,
    _unchecked_vocab,
    vocab_lists,
)
from genlm.core import BackendNotFoundError, Vocabulary
from genlm.core.backend import (
    BatchedLM,
    check_sampling_args,
    checked_count,
    checked_seconds,
    eos_id_set,
    gather_all,
    get_registry,
    resolve_model_path,
    sample_token,
    seeded_rng,
)


class AsyncLM(ABC):
    """Abstract base of the asynchronous language models (genlm-backend's ``AsyncLM``).

    A subclass implements :meth:`next_token_logprobs` and :meth:`next_token_logprobs_sync`;
    the batch methods, :meth:`sample` and :meth:`batch_sample` are built on them. The classes
    of this module do not use these defaults: they forward everything to their ``core_lm``.

    Args:
        tokenizer: a Hugging Face tokenizer; ``byte_vocab`` and ``str_vocab`` come from it.

    Attributes:
        tokenizer: the tokenizer.
        byte_vocab (list[Token]): the exact bytes of every token id of the tokenizer.
        str_vocab (list[str]): a readable string for every token id of the tokenizer.

    Rows are as wide as the model's logits, which a checkpoint may pad beyond its tokenizer
    (Qwen2: 151936 logits for 151665 tokens): then rows are wider than ``byte_vocab``, as in
    genlm-backend 0.3.1, and :attr:`vocab` (as wide as the rows) holds the padding ids as
    unused ids with no bytes. Tokens added to a tokenizer past the model's logits (GPT-2
    given a pad token, Gemma 3) make rows narrower than ``byte_vocab``, as in 0.3.1
    (genlm-control gives those tokens no weight); :attr:`vocab` leaves them out.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._token_vocab = _read_vocab(tokenizer)
        self.byte_vocab, self.str_vocab = vocab_lists(self._token_vocab, tokenizer)

    @property
    def vocab(self) -> Vocabulary:
        """The tokenizer's :class:`~genlm.core.Vocabulary` (EOS ids included): what
        genlm-bytes (``ByteBeamState.initial``, ``ByteLM``) and genlm.core APIs read, so a
        subclass works with them as the model classes do. 0.3.1's base class had no
        ``vocab``: a subclass may set its own (which those APIs then read instead)."""
        if "_own_vocab" in self.__dict__:
            return self.__dict__["_own_vocab"]
        return self._default_vocab()

    @vocab.setter
    def vocab(self, value: Any) -> None:
        self.__dict__["_own_vocab"] = value

    def _default_vocab(self) -> Vocabulary:
        return self._token_vocab

    @abstractmethod
    async def next_token_logprobs(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Normalized log-probabilities of the next token, a ``(V,)`` tensor."""

    @abstractmethod
    def next_token_logprobs_sync(self, token_ids: Sequence[int]) -> torch.Tensor:
        """The blocking twin of :meth:`next_token_logprobs`."""

    async def batch_next_token_logprobs(
        self, token_ids_list: Sequence[Sequence[int]], lora_name: str | None = None
    ) -> torch.Tensor:
        """One row per context, concurrently: a ``(len(token_ids_list), V)`` tensor.

        ``lora_name`` (genlm-backend 0.3.1's keyword): passed on to
        :meth:`next_token_logprobs` when given, so a subclass without adapters need not
        take it."""
        lora = _lora_option(lora_name)
        rows = await gather_all(self.next_token_logprobs(ids, **lora) for ids in token_ids_list)
        return torch.stack(rows)

    def batch_next_token_logprobs_sync(
        self, token_ids_list: Sequence[Sequence[int]], lora_name: str | None = None
    ) -> torch.Tensor:
        """The blocking twin of :meth:`batch_next_token_logprobs`."""
        lora = _lora_option(lora_name)
        return torch.stack([self.next_token_logprobs_sync(ids, **lora) for ids in token_ids_list])

    def clear_cache(self) -> None:  # noqa: B027 - documented no-op default
        """Forget cached results; the base class caches nothing."""

    def add_new_lora(self, lora_path: str, lora_name: str) -> None:
        """Load a LoRA adapter (genlm-backend 0.3.1's hook): a subclass with adapters
        implements it.

        Raises:
            NotImplementedError: always, in the base class.
        """
        raise NotImplementedError(f"{type(self).__name__} does not load LoRA adapters")

    def remove_lora(self, lora_name: str) -> None:
        """Unload a LoRA adapter (genlm-backend 0.3.1's hook): a subclass with adapters
        implements it.

        Raises:
            NotImplementedError: always, in the base class.
        """
        raise NotImplementedError(f"{type(self).__name__} does not unload LoRA adapters")

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int],
        temperature: float = 1.0,
        seed: int | None = None,
        lora_name: str | None = None,
    ) -> list[int]:
        """Draw up to ``max_tokens`` tokens after the prompt; stops at (and drops) an EOS token.

        Draws are genlm-core's (``sample_token``: exact Gumbel-max in float64, the sampler of
        every core model), from this model's :meth:`next_token_logprobs` rows.

        Args:
            prompt_token_ids: the prompt.
            max_tokens: the most tokens to draw.
            eos_token_ids: ids that end the draw (a list, tuple, set, numpy or torch array
                of integers); the EOS token is not returned.
            temperature: divides the log-probabilities before drawing; 0 is greedy.
            seed: seeds the draws; the same seed gives the same tokens.
            lora_name: the adapter of every step, passed on to :meth:`next_token_logprobs`
                when given.

        Returns:
            The drawn token ids, EOS excluded.

        Raises:
            TypeError, ValueError: bad ``max_tokens``, ``temperature`` or ``seed``, or an
                EOS id that is not an integer, before any work.
        """
        temperature = check_sampling_args(max_tokens, temperature)
        rng = seeded_rng(_torch_seed(seed))
        eos = eos_id_set(eos_token_ids, ())
        lora = _lora_option(lora_name)
        out: list[int] = []
        for _ in range(max_tokens):
            logprobs = await self.next_token_logprobs(list(prompt_token_ids) + out, **lora)
            token = sample_token(_sampling_row(logprobs), rng, temperature)
            if token in eos:
                break
            out.append(token)
        return out

    async def batch_sample(
        self,
        prompt_token_ids_list: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int],
        temperature: float = 1.0,
        seed: int | None = None,
        lora_name: str | None = None,
    ) -> list[list[int]]:
        """:meth:`sample` for each prompt, concurrently, each with the same ``seed`` (and
        ``lora_name``)."""
        lora = _lora_option(lora_name)
        return await gather_all(
            self.sample(p, max_tokens, eos_token_ids, temperature, seed, **lora)
            for p in prompt_token_ids_list
        )


def _sampling_row(logprobs: torch.Tensor) -> np.ndarray:
    """A row of :meth:`AsyncLM.next_token_logprobs` as the float64 vector ``sample_token``
    draws from: widened on the CPU (numpy has no bfloat16, a bf16 model's own dtype, and
    MPS no float64), and a ``(1, V)`` row read as its one row (0.3.1's sampler took both)."""
    row = logprobs.detach().cpu().to(torch.float64).numpy()  # MPS has no float64
    return row[0] if row.ndim == 2 and row.shape[0] == 1 else row


#: Set while a subclass's own ``next_token_logprobs`` (or its ``_sync`` twin) runs: a batch
#: call or ``sample`` made inside it (an override computing its row with
#: ``batch_next_token_logprobs([ids])``, as 0.3.1's ``AsyncVirtualLM`` allowed) goes to the
#: core model, not back into the override.
_IN_OVERRIDE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "genlm_backend_in_override", default=False
)


@contextlib.contextmanager
def _in_override() -> Iterator[None]:
    token = _IN_OVERRIDE.set(True)
    try:
        yield
    finally:
        _IN_OVERRIDE.reset(token)


def _marked(method: Any) -> Any:
    """A subclass's row method, run with ``_IN_OVERRIDE`` set."""
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def marked_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _in_override():
                return await method(self, *args, **kwargs)

        return marked_async

    @functools.wraps(method)
    def marked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _in_override():
            return method(self, *args, **kwargs)

    return marked


def _torch_seed(seed: Any) -> Any:
    """A negative seed as torch reads it (0.3.1 seeded torch, which takes -2**63 to
    2**64 - 1, a negative seed as its two's complement: ``hash()``-derived seeds are often
    negative); any other seed as it is, for core's check."""
    if isinstance(seed, int) and not isinstance(seed, bool) and -(2**63) <= seed < 0:
        return seed + 2**64
    return seed


def _lora_option(lora_name: str | None) -> dict[str, str]:
    """``{"lora_name": lora_name}``, or nothing for None: the base class passes an adapter
    on only when one is named, so subclasses written without ``lora_name`` keep working."""
    return {} if lora_name is None else {"lora_name": lora_name}


def _variant_option(lora_name: str | None) -> dict[str, str]:
    """``lora_name`` as core's ``variant=`` keyword; nothing for None (core's default, the
    model's current variant)."""
    return {} if lora_name is None else {"variant": lora_name}


class _CoreBacked(AsyncLM):
    """What every facade shares: all calls go to ``self.core_lm``, a genlm-core model.

    A facade model is itself a :class:`genlm.core.AsyncLM`: its row methods also take core's
    ``output=`` and ``variant=`` keywords (torch rows unless ``output`` says otherwise), so
    genlm-bytes (``ByteBeamState.initial(llm, params)``, ``ByteLM(llm)``) and any genlm.core
    API take it as it is.

    Attributes:
        core_lm (genlm.core.backend.BatchedLM): the wrapped core model, for code moving to
            genlm.core one call at a time.
    """

    core_lm: BatchedLM

    def _attach(self, core_lm: BatchedLM, owned: bool = True) -> None:
        """Set the facade's attributes from a core model (its tokenizer and vocabulary).

        ``owned``: the facade made ``core_lm``, and closes it if it refuses it.

        Raises:
            ValueError: the tokenizer's bytes cannot be recovered exactly (a WordPiece
                vocabulary), as genlm-backend's models refused it (see ``decode_vocab``).
        """
        if core_lm.tokenizer is not None:
            try:
                _check_exact(core_lm.vocab, core_lm.tokenizer)
            except ValueError:
                if owned:
                    core_lm.close()
                raise
        self.core_lm = core_lm
        self.tokenizer = tokenizer = core_lm.tokenizer
        listed = core_lm.vocab
        if tokenizer is not None and len(tokenizer) > len(listed):
            # Tokens added past the model's logits (GPT-2 given a pad token, Gemma 3): 0.3.1
            # lists every token of the tokenizer, with rows as wide as the logits.
            listed = _read_vocab(tokenizer)
        self.byte_vocab, self.str_vocab = vocab_lists(listed, tokenizer)

    @classmethod
    def _wrap(cls, core_lm: BatchedLM) -> Any:
        """A facade of class ``cls`` around a core model just made for it (no second model;
        closed if the facade refuses it)."""
        self = cls.__new__(cls)
        self._attach(core_lm)
        return self

    @staticmethod
    def _options(lora_name: str | None, options: dict[str, Any]) -> dict[str, Any]:
        """Core's keywords for one call: ``output="torch"`` unless ``options`` name another,
        and ``lora_name`` as core's per-request ``variant`` (None: the model's current one).

        Raises:
            ValueError: ``lora_name`` and a ``variant`` option that differ.
        """
        if lora_name is not None:
            if options.setdefault("variant", lora_name) != lora_name:
                raise ValueError(
                    f"lora_name={lora_name!r} and variant={options['variant']!r} name the "
                    "same option and differ; give one"
                )
        return {"output": "torch", **options}

    @property
    def batch_size(self) -> int:
        """Most contexts per forward pass: core's ``max_batch_size`` (settable)."""
        return self.core_lm.batcher.max_batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self.core_lm.batcher.max_batch_size = checked_count("batch_size", value, 1)

    @property
    def timeout(self) -> float:
        """Longest wait of a partial batch for company, in seconds: core's ``max_wait_s``
        (settable; genlm-backend waited this long after the latest request, core waits at
        most this long after the oldest)."""
        return self.core_lm.batcher.max_wait_s

    @timeout.setter
    def timeout(self, value: float) -> None:
        self.core_lm.batcher.max_wait_s = checked_seconds("timeout", value)

    def add_new_lora(self, lora_path: str, lora_name: str = "lora_1") -> None:
        """Load the adapter saved at ``lora_path`` as ``lora_name``; an adapter already
        loaded under that name is replaced, once the new one has loaded (core's
        ``add_lora(..., replace=True)``): if the new one fails to load, the old one stays
        loaded and serving, where genlm-backend 0.3.1's hf class had removed it first. The
        name stays current if it was. hf: a peft adapter (needs peft); vllm: a PEFT adapter
        directory, on an engine started with ``enable_lora=True``; mlx: an adapter saved
        by ``mlx_lm.lora``.

        Raises:
            NotImplementedError: the backend has no adapters (the mock).
        """
        add = self._lora_method("add_lora")
        if lora_name in self.core_lm.loaded_loras:
            add(lora_path, lora_name, replace=True)
        else:  # a new name: also a plugin whose add_lora predates ``replace``
            add(lora_path, lora_name)

    def remove_lora(self, lora_name: str) -> None:
        """Unload the adapter ``lora_name``, its KV and the cached rows (the backend's
        ``remove_lora``); the base model becomes current if it was.

        Raises:
            UnknownVariantError: no adapter of that name is loaded.
            NotImplementedError: the backend cannot unload adapters.
        """
        self._lora_method("remove_lora")(lora_name)

    def set_lora(self, lora_path: str | None = None, lora_name: str = "lora_1") -> None:
        """Make ``lora_name`` the adapter of later calls without ``lora_name=``; a
        ``lora_path`` not loaded yet is loaded first."""
        select = self._lora_method("set_lora")
        if lora_path is not None and lora_name not in self.core_lm.loaded_loras:
            self.add_new_lora(lora_path, lora_name)
        select(lora_name)

    def clear_lora(self) -> None:
        """Later calls without ``lora_name=`` use the base model."""
        self._lora_method("clear_lora")()

    @property
    def current_variant(self) -> Hashable:
        """The adapter a call without ``lora_name=`` uses now (None: the base model), core's
        :attr:`~genlm.core.backend.BatchedLM.current_variant`: a byte-level model reads it so
        that its cached masses stay those of one adapter."""
        return self.core_lm.current_variant

    def _lora_method(self, name: str) -> Any:
        """The core model's adapter method ``name``.

        Raises:
            NotImplementedError: the core model has no such method.
        """
        method = getattr(self.core_lm, name, None)
        if method is None:
            raise NotImplementedError(
                f"{type(self).__name__} over {type(self.core_lm).__name__} has no LoRA "
                f"adapters ({name})"
            )
        return method

    @property
    def device_rows(self) -> bool:
        """Whether the core model keeps its rows on a device (``HFLM`` on a GPU): byte-level
        models then ask for torch rows and compute where they lie."""
        return bool(getattr(self.core_lm, "device_rows", False))

    async def next_token_logprobs(
        self, token_ids: Sequence[int], lora_name: str | None = None, **options: Any
    ) -> torch.Tensor:
        """Normalized log-probabilities of the next token: a float32 ``(V,)`` tensor.

        Concurrent calls are batched by core's scheduler; results are cached.

        Args:
            token_ids: the context (at least one token id).
            lora_name: the LoRA adapter to run under for this call only (hf, vllm, mlx); None: the
                model's current adapter (the base model unless ``set_lora`` chose one).
            **options: genlm-core's keywords, so this model is a :class:`genlm.core.AsyncLM`
                (genlm-bytes and any genlm.core API take it as one): ``output`` (default
                ``"torch"``; ``"numpy"`` gives core's float32 arrays) and ``variant`` (the
                same as ``lora_name``).

        Raises:
            ValueError: an empty or invalid context (``genlm.core.InvalidContextError``),
                a backend without adapters given a ``lora_name``, or ``lora_name`` and a
                different ``variant``.
            UnknownVariantError: no adapter named ``lora_name`` is loaded (both a
                ``KeyError`` and the ``ValueError`` genlm-backend 0.3.1 raised).
        """
        return await self.core_lm.next_token_logprobs(
            token_ids, **self._options(lora_name, options)
        )

    def next_token_logprobs_sync(
        self, token_ids: Sequence[int], lora_name: str | None = None, **options: Any
    ) -> torch.Tensor:
        """The blocking twin of :meth:`next_token_logprobs` (still cached and batched by id)."""
        return self.core_lm.next_token_logprobs_sync(token_ids, **self._options(lora_name, options))

    async def batch_next_token_logprobs(
        self, token_ids_list: Sequence[Sequence[int]], lora_name: str | None = None, **options: Any
    ) -> torch.Tensor:
        """One row per context: a float32 ``(len(token_ids_list), V)`` tensor (through a
        subclass's own :meth:`next_token_logprobs`, if it has one and no core ``options``
        are given, as 0.3.1's ``AsyncTransformer`` did)."""
        if not options and self._overrides("next_token_logprobs"):
            return await AsyncLM.batch_next_token_logprobs(self, token_ids_list, lora_name)
        return await self.core_lm.batch_next_token_logprobs(
            token_ids_list, **self._options(lora_name, options)
        )

    def batch_next_token_logprobs_sync(
        self, token_ids_list: Sequence[Sequence[int]], lora_name: str | None = None, **options: Any
    ) -> torch.Tensor:
        """The blocking twin of :meth:`batch_next_token_logprobs`."""
        if not options and self._overrides("next_token_logprobs_sync"):
            return AsyncLM.batch_next_token_logprobs_sync(self, token_ids_list, lora_name)
        return self.core_lm.batch_next_token_logprobs_sync(
            token_ids_list, **self._options(lora_name, options)
        )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("next_token_logprobs", "next_token_logprobs_sync"):
            if name in cls.__dict__:
                setattr(cls, name, _marked(cls.__dict__[name]))

    def _overrides(self, name: str) -> bool:
        """Whether a subclass defines its own row method ``name`` and the call is not made
        from inside it. 0.3.1's ``AsyncTransformer`` built the batch calls and ``sample`` on
        :meth:`next_token_logprobs`, the natural place for a subclass to change rows (a
        bias, a constraint), so they go through it then; a batch call the override makes
        itself (``AsyncVirtualLM``'s were engine calls) goes to the core model."""
        return getattr(type(self), name) is not getattr(_CoreBacked, name) and not (
            _IN_OVERRIDE.get()
        )

    def next_token_logprobs_uncached(
        self, token_ids: Sequence[int], lora_name: str | None = None, **options: Any
    ) -> torch.Tensor:
        """A fresh computation: bypasses the output cache and the scheduler.

        The backend still resumes from its KV cache where it has one (the result equals a
        full forward up to float rounding); use :meth:`clear_kv_cache` first to avoid that.
        """
        return self.core_lm.next_token_logprobs_uncached(
            token_ids, **self._options(lora_name, options)
        )

    def clear_cache(self) -> None:
        """Forget cached rows and the backend's KV, prompts kept by :meth:`cache_kv`
        included (genlm-backend's documented "log probabilities and key/value pairs").

        The KV goes first: core's ``clear_cache`` then drops every row computed before it
        (a batch running between the two would otherwise store rows from pinned KV)."""
        self.clear_kv_cache()
        self.core_lm.clear_cache()

    def clear_kv_cache(self) -> None:
        """Drop the backend's KV cache, pinned prompts included (output rows stay cached):
        hf's and mlx's; vLLM's engine keeps its own prefix cache, which :meth:`clear_cache`
        resets."""
        clear = getattr(self.core_lm, "clear_kv_cache", None)
        if clear is not None:
            clear()

    def cache_kv(self, prompt_tokens: Sequence[int], lora_name: str | None = None) -> None:
        """Compute and keep the KV of a prompt so later contexts extending it run only new tokens.

        ``lora_name``: the adapter whose KV to keep (None: the model's current adapter, as
        for every call). Backends without pinning (vllm's own prefix cache) compute the
        prompt once.
        """
        options = _variant_option(lora_name)
        cache_kv = getattr(self.core_lm, "cache_kv", None)
        if cache_kv is not None:
            cache_kv(prompt_tokens, **options)
        else:
            self.core_lm.next_token_logprobs_sync(prompt_tokens, **options)

    def reset_async_queries(self) -> None:
        """Nothing to reset: core drops queued requests whose callers are gone, and its
        scheduler state is per event loop, so an interrupted run leaves no stale queries."""

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int],
        temperature: float = 1.0,
        seed: int | None = None,
        lora_name: str | None = None,
    ) -> list[int]:
        """Draw up to ``max_tokens`` tokens; stops at an EOS token, which is not returned.

        Draws are exact (core's Gumbel-max over the float32 row); the same seed gives the same
        tokens, though not the same tokens as genlm-backend's torch.multinomial draws (a
        negative seed is read as torch reads it). ``lora_name``: the adapter of every step
        (core's ``variant``; None: the model's current one). A subclass with its own
        :meth:`next_token_logprobs` samples from its rows, as 0.3.1's ``AsyncTransformer``
        did.
        """
        if self._overrides("next_token_logprobs"):
            return await AsyncLM.sample(
                self, prompt_token_ids, max_tokens, eos_token_ids, temperature, seed, lora_name
            )
        eos = eos_id_set(eos_token_ids, ())
        options = _variant_option(lora_name)
        tokens = await self.core_lm.sample(
            prompt_token_ids, max_tokens, eos, temperature, _torch_seed(seed), **options
        )
        if tokens and tokens[-1] in eos:
            tokens.pop()
        return tokens

    def _default_vocab(self) -> Vocabulary:
        """The core model's :class:`~genlm.core.Vocabulary`, as wide as its rows (logit rows
        padded beyond the tokenizer are unused ids here, absent from ``byte_vocab``)."""
        return self.core_lm.vocab

    def close(self) -> None:
        """Release the model (its worker thread and backend); later calls raise."""
        self.core_lm.close()

    async def aclose(self) -> None:
        """Awaitable :meth:`close`: fails queued requests and lets the batches already
        handed to the worker deliver."""
        await self.core_lm.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _core_opts(
    batch_size: int | None = None, timeout: float | None = None, **opts: Any
) -> dict[str, Any]:
    """genlm-backend's scheduler options as core options.

    ``batch_size`` -> ``max_batch_size``; ``timeout`` -> ``max_wait_s`` (a partial batch then
    fires no earlier than that long after its first request, as 0.3's batcher waits for
    company; later when the worker is busy).
    """
    if batch_size is not None:
        opts["max_batch_size"] = batch_size
    if timeout is not None:
        opts["max_wait_s"] = timeout
    return opts


class AsyncTransformer(_CoreBacked):
    """A Hugging Face causal LM (genlm-backend's ``AsyncTransformer``) on the ``hf`` backend.

    Args:
        hf_model: a transformers causal LM (or a peft model with adapters).
        hf_tokenizer: its tokenizer.
        batch_size: most contexts per forward pass (core's ``max_batch_size``).
        timeout: longest wait for a batch to fill, in seconds (core's ``max_wait_s``).
        **opts: further :class:`genlm.backends.hf.HFLM` options (``kv_cache_bytes``,
            ``cache_bytes``, ``max_forward_tokens``, ...).

    Attributes:
        core_lm (genlm.backends.hf.HFLM): the wrapped core model.
    """

    def __init__(
        self,
        hf_model: Any,
        hf_tokenizer: Any,
        batch_size: int = 20,
        timeout: float = 0.02,
        **opts: Any,
    ):
        from genlm.backends.hf import HFLM

        core = HFLM(hf_model, hf_tokenizer, **_core_opts(batch_size, timeout, **opts))
        self._attach(core)

    @classmethod
    def from_name(
        cls,
        model_id: str,
        bitsandbytes_opts: dict[str, Any] | None = None,
        hf_opts: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> AsyncTransformer:
        """Load a model by Hub id or local directory (names go through genlm-core's resolution).

        Args:
            model_id: the model's name or path.
            bitsandbytes_opts: ``transformers.BitsAndBytesConfig`` arguments (quantization).
            hf_opts: extra ``AutoModelForCausalLM.from_pretrained`` arguments.
            **kwargs: ``batch_size``, ``timeout`` and :meth:`genlm.backends.hf.HFLM.from_name`
                options (``device``, ``dtype``, ``kv_cache_bytes``, ``cache_bytes``, ...).
        """
        from genlm.backends.hf import HFLM

        opts = dict(hf_opts or {})
        if bitsandbytes_opts:
            import transformers

            opts["quantization_config"] = transformers.BitsAndBytesConfig(**bitsandbytes_opts)
            opts.setdefault("device_map", "cuda" if torch.cuda.is_available() else "cpu")
        batch_size = kwargs.pop("batch_size", 20)
        timeout = kwargs.pop("timeout", 0.02)
        core = HFLM.from_name(model_id, hf_opts=opts, **_core_opts(batch_size, timeout, **kwargs))
        return cls._wrap(core)

    @property
    def model(self) -> Any:
        """The transformers model (a peft model once an adapter is loaded)."""
        return self.core_lm.model

    @property
    def device(self) -> torch.device:
        """The device of the model's weights (rows are computed there)."""
        return self.core_lm.shape.device


class AsyncVirtualLM(_CoreBacked):
    """A vLLM model (genlm-backend's ``AsyncVirtualLM``) on the ``vllm`` backend.

    GenLM's vllm backend builds and owns its engine, so the constructor takes a core
    ``genlm.backends.vllm.VLLMLM`` (what :meth:`from_name` builds), not a vLLM engine.

    Args:
        async_llm_engine: a ``genlm.backends.vllm.VLLMLM``.
        cache_size: accepted for compatibility; the core model's output cache was sized
            when it was built (``from_name(cache_size=...)`` sizes it).
        cache_opts: accepted and ignored (genlm-backend's LRU options; core's cache is an
            LRU bounded in bytes).

    Raises:
        TypeError: ``async_llm_engine`` is a vLLM engine (use :meth:`from_name`).
    """

    def __init__(self, async_llm_engine: Any, cache_size: int = 0, cache_opts: dict | None = None):
        if not isinstance(async_llm_engine, BatchedLM):
            raise TypeError(
                "GenLM's vllm backend builds its own engine: use "
                "AsyncVirtualLM.from_name(model_name, engine_opts={...})"
            )
        self._attach(async_llm_engine, owned=False)

    @classmethod
    def from_name(
        cls, model_name: str, engine_opts: dict[str, Any] | None = None, **kwargs: Any
    ) -> AsyncVirtualLM:
        """Start a vLLM engine for ``model_name`` (needs genlm-backend-vllm and a GPU).

        Args:
            model_name: the model's name or path.
            engine_opts: ``vllm.LLM`` arguments, passed through.
            **kwargs: ``cache_size`` (core's output cache holds that many rows' bytes,
                ``cache_size * len(vocab) * 4``; its keys count too, so slightly fewer rows
                fit; 0, the documented default, disables it), ``cache_opts`` (ignored),
                ``batch_size``, ``timeout`` and core options.
        """
        VLLMLM = _plugin("vllm").VLLMLM  # noqa: N806 - a class

        cache_size = kwargs.pop("cache_size", 0)
        kwargs.pop("cache_opts", None)
        kwargs.setdefault("cache_bytes", 0)
        core = VLLMLM.from_name(model_name, engine_opts, **_core_opts(**kwargs))
        if cache_size:  # rows are V float32s; the width is known once the model is loaded
            core.output_cache.resize(int(cache_size) * len(core.vocab) * 4)
        return cls._wrap(core)


class AsyncMlxLM(_CoreBacked):
    """An MLX model (genlm-backend's ``AsyncMlxLM``) on the ``mlx`` backend (Apple silicon).

    Args:
        mlx_lm_model: an mlx-lm model.
        tokenizer: its tokenizer.
        batch_size: core's ``max_batch_size``.
        timeout: core's ``max_wait_s``.
        prefill_step_size: tokens per prefill chunk (core's ``prefill_chunk_size``).
        cache_size: accepted for compatibility: GenLM bounds the KV cache in bytes
            (``kv_cache_bytes=``), not in entries.
        cache_opts: accepted and ignored, as the release takes it (its cache's options).
        **opts: further ``genlm.backends.mlx.MLXLM`` options.
    """

    def __init__(
        self,
        mlx_lm_model: Any,
        tokenizer: Any,
        batch_size: int = 5,
        timeout: float = 0.001,
        prefill_step_size: int = 2048,
        cache_size: int = 400,
        cache_opts: dict | None = None,
        **opts: Any,
    ):
        opts = _mlx_opts(batch_size, timeout, prefill_step_size, opts)
        self._attach(_plugin("mlx").MLXLM(mlx_lm_model, tokenizer, **opts))

    @classmethod
    def from_name(
        cls,
        model_name: str,
        batch_size: int = 5,
        timeout: float = 0.001,
        prefill_step_size: int = 2048,
        cache_size: int = 400,
        cache_opts: dict | None = None,
        **opts: Any,
    ) -> AsyncMlxLM:
        """Load an mlx-lm model by name or path; options (and their defaults) as for the
        constructor."""
        opts = _mlx_opts(batch_size, timeout, prefill_step_size, opts)
        return cls._wrap(_plugin("mlx").MLXLM.from_name(model_name, **opts))


def _mlx_opts(
    batch_size: int, timeout: float, prefill_step_size: int, opts: dict[str, Any]
) -> dict[str, Any]:
    """``genlm.backends.mlx.MLXLM`` options from the arguments :class:`AsyncMlxLM`'s
    constructor and ``from_name`` share (with their defaults); ``cache_size`` and
    ``cache_opts`` have no counterpart."""
    return _core_opts(batch_size, timeout, prefill_chunk_size=prefill_step_size, **opts)


class MockAsyncLM(_CoreBacked):
    """A deterministic fake model over a tokenizer's vocabulary (genlm-backend's ``MockAsyncLM``).

    Rows are core's :class:`genlm.core.mock.MockLM` rows: a pure function of the whole
    context, normalized, different for different contexts (not genlm-backend's values).

    Args:
        tokenizer: a Hugging Face tokenizer.
        **opts: :class:`genlm.core.mock.MockLM` options (``seed``, ``latency_s``, ...).
    """

    def __init__(self, tokenizer: Any, **opts: Any):
        from genlm.core.mock import MockLM

        # Read as decode_vocab reads it, and checked exact by _attach, which closes the mock
        # if it refuses it (genlm-backend's MockAsyncLM refused what decode_vocab refuses).
        self._attach(MockLM(_unchecked_vocab(tokenizer), tokenizer=tokenizer, **opts))

    @classmethod
    def from_name(cls, model_name: str, **kwargs: Any) -> MockAsyncLM:
        """A mock over the tokenizer of ``model_name`` (Hub id, path or ``"stories260K"``)."""
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(resolve_model_path(model_name)), **kwargs)


#: The facade's class for each backend it wraps.
_CLASSES: dict[str, type[_CoreBacked]] = {
    "vllm": AsyncVirtualLM,
    "hf": AsyncTransformer,
    "mock": MockAsyncLM,
    "mlx": AsyncMlxLM,
}


def load_model_by_name(
    name: str, backend: str | None = None, llm_opts: dict[str, Any] | None = None
) -> AsyncLM:
    """Load a model by name with one of genlm-backend's backends.

    Args:
        name: a Hub id, a local path, or a name genlm-core resolves (``"stories260K"``).
        backend: ``"vllm"``, ``"hf"``, ``"mock"`` or ``"mlx"``; None lets genlm-core's
            registry choose among them as it does for every model: vllm with a CUDA GPU,
            mlx on Apple silicon, else hf.
        llm_opts: options for the class's ``from_name``.

    Returns:
        An :class:`AsyncVirtualLM`, :class:`AsyncTransformer`, :class:`MockAsyncLM` or
        :class:`AsyncMlxLM`.

    Raises:
        ValueError: an unknown backend, or (``genlm.core.BackendNotFoundError``) none of
            them installed.
        ImportError: ``"vllm"`` or ``"mlx"`` whose GenLM plugin is not installed (also a
            ``BackendNotFoundError``); the message says what to install.
        genlm.core.BackendUnavailableError: the backend cannot run here (e.g. vllm without
            a GPU, or its engine package missing); the message says why.
    """
    if backend is not None and backend not in _CLASSES:
        raise ValueError(f"Invalid backend: {backend!r}; choose one of {sorted(_CLASSES)}")
    try:
        spec = get_registry().select(backend, among=_CLASSES)
    except BackendNotFoundError as exc:
        if backend in _PLUGINS:  # genlm-backend raises ImportError when its engine is missing
            raise _NotInstalledError(str(exc)) from exc
        raise
    return _CLASSES[spec.name].from_name(name, **(llm_opts or {}))


#: The backends whose engine comes in a plugin distribution of its own.
_PLUGINS = {"vllm": "genlm-backend-vllm", "mlx": "genlm-backend-mlx"}


class _NotInstalledError(BackendNotFoundError, ImportError):
    """A backend named by genlm-backend whose GenLM plugin is not installed: an
    ``ImportError``, as genlm-backend raises when vllm or mlx is missing, and core's
    ``BackendNotFoundError``."""


def _plugin(backend: str) -> ModuleType:
    """The GenLM plugin module of ``backend`` (``genlm.backends.vllm``...).

    Raises:
        ImportError: it is not installed; the message names the distribution to install.
    """
    module = f"genlm.backends.{backend}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module.startswith(exc.name):
            raise  # the plugin is there; something it imports is not: its own message
        raise ImportError(
            f"the {backend} backend is not installed: pip install {_PLUGINS[backend]}"
        ) from exc
