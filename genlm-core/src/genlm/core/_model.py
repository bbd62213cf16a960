"""``BatchedLM``: the base class every backend extends.

A backend implements one synchronous method, :meth:`BatchedLM._logprobs_batch`
("evaluate this batch of contexts"), and optionally the hooks for backend state
(KV caches, adapters, shutdown). Everything else lives here, once: input validation,
the output cache, the autobatching scheduler, the dedicated worker thread, sync twins,
sampling and cleanup.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import logging
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from genlm.core._errors import InvalidContextError, ModelClosedError
from genlm.core._output_cache import OutputCache
from genlm.core._rows import Output, as_output, check_output, is_torch, split_torch, stack_output
from genlm.core._sampling import sample_token
from genlm.core._scheduler import AutoBatcher
from genlm.core._vocab import Vocabulary
from genlm.core._worker import ModelWorker

logger = logging.getLogger(__name__)

#: A request as the scheduler sees it: (variant, token ids).
Request = tuple[Hashable, tuple[int, ...]]


class _Current(enum.Enum):
    VARIANT = "the model's current variant"


#: ``variant=`` default: the variant the model's state selects (:meth:`BatchedLM._variant`,
#: e.g. hf's ``set_lora``). Any other value names the variant of this one request.
CURRENT_VARIANT = _Current.VARIANT


def validate_context(token_ids: Sequence[int], vocab_size: int) -> tuple[int, ...]:
    """Return ``token_ids`` as a tuple of ints, or raise a clear ``InvalidContextError``."""
    if isinstance(token_ids, (str, bytes)):
        raise InvalidContextError(
            f"expected a sequence of token ids, got {type(token_ids).__name__}; "
            "tokenize text first (e.g. lm.tokenizer.encode(text))"
        )
    try:
        ids = tuple(token_ids)
    except TypeError:
        raise InvalidContextError(
            f"expected a sequence of token ids, got {type(token_ids).__name__}"
        ) from None
    if not ids:
        raise InvalidContextError(
            "empty context: a next-token distribution needs at least one token "
            "(start from the BOS token, lm.vocab.bos_token_id, if the model has one)"
        )
    if not all(type(t) is int for t in ids):
        converted = []
        for pos, t in enumerate(ids):
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
                raise InvalidContextError(
                    f"token id at position {pos} is {t!r} ({type(t).__name__}); "
                    "token ids must be integers"
                )
            converted.append(int(t))
        ids = tuple(converted)
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise InvalidContextError(
            f"token id {bad} at position {ids.index(bad)} is out of range "
            f"for a vocabulary of {vocab_size} tokens"
        )
    return ids


class BatchedLM(abc.ABC):
    """Base class of GenLM backends; see the module docstring.

    Args:
        vocab: the model's byte vocabulary; its length is the width of every
            log-probability row.
        tokenizer: the model's tokenizer, or None.
        max_batch_size: most distinct contexts per forward pass.
        max_wait_s: longest time a request waits for others to batch with.
        cache_bytes: byte budget of the output cache (0 disables it).
        name: names the worker thread and log messages.
    """

    def __init__(
        self,
        vocab: Vocabulary,
        tokenizer: Any = None,
        *,
        max_batch_size: int = 32,
        max_wait_s: float = 0.001,
        cache_bytes: int = 256 * 2**20,
        name: str | None = None,
    ):
        if len(vocab) == 0:
            raise ValueError("a model needs a non-empty vocabulary")
        self._vocab = vocab
        self._tokenizer = tokenizer
        self.name = name or type(self).__name__
        self.worker = ModelWorker(f"genlm-{self.name}")
        self.output_cache = OutputCache(cache_bytes)
        self.batcher: AutoBatcher[Request, np.ndarray] = AutoBatcher(
            self._run_requests,
            self.worker,
            max_batch_size=max_batch_size,
            max_wait_s=max_wait_s,
            key=lambda request: request,
            group=lambda request: request[0],
            on_result=self.output_cache.put,
        )
        self._closed = False

    # ---- what a backend implements -------------------------------------------------

    @abc.abstractmethod
    def _logprobs_batch(self, contexts: list[tuple[int, ...]], variant: Hashable) -> np.ndarray:
        """Next-token log-probabilities for each context, shape ``(len(contexts), V)``.

        Runs on the model's worker thread, never on the event loop. Contexts are
        validated, distinct and non-empty; ``variant`` is what :meth:`_variant` returned
        when the requests were made (all requests of a batch share it). Rows must be
        normalized log-probabilities over ``len(self.vocab)`` tokens.
        """

    def _variant(self) -> Hashable:
        """What besides the context changes the result (e.g. the active adapter).

        It is part of every cache key and is captured when a request is made.
        """
        return None

    def _check_variant(self, variant: Hashable) -> Hashable:
        """Validate a per-request ``variant=`` (runs on the caller, before queueing).

        The base model has one variant, None; a backend with adapters overrides this to
        accept their names (hf: a loaded LoRA adapter's name).

        Raises:
            ValueError: ``variant`` is not one this model serves.
        """
        if variant is not None:
            raise ValueError(f"{self.name} has no variants (adapters); got variant={variant!r}")
        return variant

    def _clear_backend_cache(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Drop backend state such as KV caches (runs on the worker thread)."""

    def _close_backend(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Release backend resources (runs on the worker thread, once)."""

    # ---- the AsyncLM protocol ------------------------------------------------------

    @property
    def vocab(self) -> Vocabulary:
        return self._vocab

    @property
    def byte_vocab(self) -> list[bytes]:
        return list(self._vocab.tokens)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def _request(self, token_ids: Sequence[int], variant: Hashable = CURRENT_VARIANT) -> Request:
        if self._closed:
            raise ModelClosedError(f"{self.name} is closed")
        ids = validate_context(token_ids, len(self._vocab))
        if variant is CURRENT_VARIANT:
            return (self._variant(), ids)
        return (self._check_variant(variant), ids)

    async def next_token_logprobs(
        self,
        token_ids: Sequence[int],
        *,
        variant: Hashable = CURRENT_VARIANT,
        output: Output = "numpy",
    ) -> Any:
        """Log-probabilities of the next token after ``token_ids``, shape ``(V,)``, float32.

        Args:
            token_ids: the context, at least one token id.
            variant: what besides the context selects the distribution, for this request
                only (hf: a LoRA adapter name, None for the base model); by default the
                model's current one (``set_lora``).
            output: ``"numpy"`` (an array, read-only when shared with the cache) or
                ``"torch"`` (a tensor on the device the backend computed it on; torch is
                imported only then). See ``genlm.core._rows``.

        Raises:
            InvalidContextError: bad token ids. ValueError: unknown ``variant`` or ``output``.
            ModelClosedError: the model is closed.
        """
        check_output(output)
        request = self._request(token_ids, variant)
        row = self.output_cache.get(request)
        if row is None:
            row = await self.batcher.submit(request)
        return as_output(row, output)

    def next_token_logprobs_sync(
        self,
        token_ids: Sequence[int],
        *,
        variant: Hashable = CURRENT_VARIANT,
        output: Output = "numpy",
    ) -> Any:
        """The blocking twin of :meth:`next_token_logprobs` (same arguments)."""
        check_output(output)
        row = self._rows_sync([self._request(token_ids, variant)])[0]
        return as_output(row, output)

    async def batch_next_token_logprobs(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        variant: Hashable = CURRENT_VARIANT,
        output: Output = "numpy",
    ) -> Any:
        """One row per context, shape ``(len(contexts), V)``; arguments as for one context."""
        check_output(output)
        requests = [self._request(c, variant) for c in contexts]  # validate all first
        rows = await asyncio.gather(*(self._row(r) for r in requests))
        return stack_output(rows, len(self._vocab), output)

    def batch_next_token_logprobs_sync(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        variant: Hashable = CURRENT_VARIANT,
        output: Output = "numpy",
    ) -> Any:
        """The blocking twin of :meth:`batch_next_token_logprobs` (same arguments)."""
        check_output(output)
        rows = self._rows_sync([self._request(c, variant) for c in contexts])
        return stack_output(rows, len(self._vocab), output)

    async def _row(self, request: Request) -> Any:
        row = self.output_cache.get(request)
        return row if row is not None else await self.batcher.submit(request)

    def _rows_sync(self, requests: list[Request]) -> list[Any]:
        """Rows of validated requests, in their stored form, computed on the worker thread."""
        rows: list[Any] = [self.output_cache.get(r) for r in requests]
        missing = list(dict.fromkeys(r for r, row in zip(requests, rows) if row is None))
        computed: dict[Request, Any] = {}
        for variant in dict.fromkeys(r[0] for r in missing):
            group = [r for r in missing if r[0] == variant]
            for start in range(0, len(group), self.batcher.max_batch_size):
                chunk = group[start : start + self.batcher.max_batch_size]
                results = self.worker.call(self._run_requests, chunk)
                for request, row in zip(chunk, results):
                    computed[request] = self.output_cache.put(request, row)
        return [row if row is not None else computed[r] for r, row in zip(requests, rows)]

    def _run_requests(self, requests: list[Request]) -> list[np.ndarray]:
        """Worker-thread side of a batch: call the backend and check what it returns."""
        variant = requests[0][0]
        out = self._logprobs_batch([r[1] for r in requests], variant)
        expected = (len(requests), len(self._vocab))
        if is_torch(out):  # rows stay on the backend's device
            return split_torch(out, expected, self.name)
        out = np.asarray(out)
        if out.shape != expected:
            raise RuntimeError(
                f"{self.name}: backend returned log-probabilities of shape {out.shape}, "
                f"expected {expected}"
            )
        out = out.astype(np.float32, copy=False)
        return [np.array(row) for row in out]  # own memory: cache accounting stays exact

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        """Ancestral sampling; returns the new tokens, the EOS token included if one ended it.

        ``eos_token_ids=None`` uses ``vocab.eos_token_ids``; ``temperature=0`` is greedy.
        The same seed gives the same tokens.
        """
        return await self._sample(
            prompt_token_ids, max_tokens, eos_token_ids, temperature, np.random.default_rng(seed)
        )

    async def _sample(self, prompt, max_tokens, eos_token_ids, temperature, rng) -> list[int]:
        context = list(self._request(prompt)[1])
        eos = set(self._vocab.eos_token_ids if eos_token_ids is None else eos_token_ids)
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        generated: list[int] = []
        while len(generated) < max_tokens:
            logprobs = await self.next_token_logprobs(context)
            token = sample_token(logprobs, rng, temperature)
            generated.append(token)
            context.append(token)
            if token in eos:
                break
        return generated

    async def batch_sample(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[list[int]]:
        """:meth:`sample` for each prompt, concurrently; prompt ``i`` gets its own seed stream."""
        rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(prompts))]
        return list(
            await asyncio.gather(
                *(
                    self._sample(p, max_tokens, eos_token_ids, temperature, rng)
                    for p, rng in zip(prompts, rngs)
                )
            )
        )

    def clear_cache(self) -> None:
        """Forget cached outputs and backend state (KV)."""
        self.output_cache.clear()
        if not self._closed:
            self.worker.call(self._clear_backend_cache)

    async def aclose(self) -> None:
        """Fail queued requests, finish running ones, release the backend. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.batcher.aclose()
        await self.worker.run_async(self._close_backend)
        self.worker.close(wait=False)
        self.output_cache.clear()

    def close(self) -> None:
        """Blocking :meth:`aclose`, for code outside an event loop."""
        if self._closed:
            return
        self._closed = True
        self.batcher.reject_new()
        self.worker.call(self._close_backend)
        self.worker.close()
        self.output_cache.clear()

    async def __aenter__(self) -> BatchedLM:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} vocab={len(self._vocab)}>"
