"""``BatchedLM``: the base class every backend extends.

A backend implements one synchronous method, :meth:`BatchedLM._logprobs_batch`
("evaluate this batch of contexts"), and optionally the hooks for backend state
(KV caches, adapters, shutdown). Everything else lives here, once: input validation,
the output cache, the autobatching scheduler, the dedicated worker thread, sync twins,
sampling and cleanup.
"""

from __future__ import annotations

import abc
import concurrent.futures
import enum
import logging
import math
import operator
import sys
import threading
import weakref
from collections.abc import Collection, Hashable, Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from genlm.core._errors import (
    BackendError,
    InvalidContextError,
    ModelClosedError,
    UnknownVariantError,
)
from genlm.core._extensions import ids
from genlm.core._gather import gather_all
from genlm.core._output_cache import OutputCache
from genlm.core._request import Request
from genlm.core._rows import (
    BatchRows,
    Output,
    as_output,
    check_output,
    is_torch,
    numpy_rows,
    row_summary,
    split_torch,
    stack_output,
)
from genlm.core._sampling import (
    check_sampling_args,
    eos_id_set,
    sample_token,
    seed_streams,
    seeded_rng,
)
from genlm.core._scheduler import AutoBatcher
from genlm.core._validation import checked_count, is_integer, is_unordered, validate_context
from genlm.core._vocab import Vocabulary
from genlm.core._worker import ModelWorker

#: Checks, copies and hashes a context in one C pass, where ``_ids`` loads; else None and
#: ``validate_context`` checks in Python.
_make_request = None if ids is None else ids.make_request

logger = logging.getLogger(__name__)


class _Current(enum.Enum):
    VARIANT = "the model's current variant"


CURRENT_VARIANT = _Current.VARIANT
"""The ``variant=`` default: the variant the model's state selects
(:meth:`BatchedLM._variant`, e.g. hf's ``set_lora``). Any other value names the variant of
this one request; a backend method that takes ``variant=`` (hf's ``cache_kv``) uses it as
its default too."""


class BatchedLM(abc.ABC):
    """Base class of GenLM backends; see the module docstring.

    Every request method takes a context (at least one token id, ints in
    ``range(len(vocab))``) and two keywords: ``variant=``, what besides the context selects
    the distribution for this request only (hf: a LoRA adapter name, None for the base
    model; by default the model's current one, ``set_lora``), and ``output=``, ``"numpy"``
    (an array, read-only when shared with the cache) or ``"torch"`` (a tensor on the device
    the backend computed it on; torch is imported only then). Rows are float32 of width
    ``len(vocab)``. Every argument is validated on the caller, before anything is queued
    (a batch call validates every context before computing any). Errors:
    ``InvalidContextError`` for bad ids or a context longer than ``max_context_length``;
    ``ValueError`` for an unknown ``output`` or a ``variant`` the model does not serve
    (an adapter not loaded: ``UnknownVariantError``, also a ``KeyError``);
    ``ModelClosedError`` once closed;
    ``BackendError`` when the backend returns rows that are not normalized
    log-probabilities of the vocabulary's width (or its :meth:`_variant` is unhashable).
    Sampling arguments are checked by ``check_sampling_args`` (``TypeError``/``ValueError``)
    before any work.

    Args:
        vocab: the model's byte vocabulary; its length is the width of every
            log-probability row.
        tokenizer: the model's tokenizer, or None.
        max_batch_size: most distinct contexts per forward pass.
        max_wait_s: how long a partial batch waits for company after its oldest request;
            0 (the default) fires it once the requests made together have all arrived and
            the worker has room (see :class:`~genlm.core.backend.AutoBatcher`).
        cache_bytes: byte budget of the output cache (0 disables it).
        name: names the worker thread and log messages.
        max_context_length: the longest context the model accepts (its maximum
            positions), or None for no limit. Longer contexts raise
            ``InvalidContextError`` when requested, before they reach a batch; backends
            set it from the model's configuration.

    Raises:
        TypeError: ``max_batch_size`` or ``cache_bytes`` not an integer, ``max_wait_s``
            not a number.
        ValueError: an empty vocabulary, or an option out of range (``max_batch_size``
            below 1, ``cache_bytes`` negative, ``max_wait_s`` negative or not finite,
            ``max_context_length`` not an integer >= 1).
    """

    #: Whether the backend never writes to an array (or tensor) after returning it from
    #: :meth:`_logprobs_batch`: a fresh one each call, or constant ones. Then core keeps the
    #: batch as it is and hands out views of its rows; otherwise (the default, safe for a
    #: backend that reuses an output buffer) core copies each batch once first. Either way
    #: a row is a read-only view of its batch, and holding it holds the batch's memory,
    #: which the output cache counts as the returned array's bytes: a stable backend returns
    #: arrays that are their own memory (not slices of a larger one it does not keep).
    stable_batches: ClassVar[bool] = False
    #: Whether the worker thread, once the model is closed, parks until the process exits
    #: instead of ending (``ModelWorker(park=True)``): for engines whose per-thread state
    #: breaks when a thread that used it ends (the mlx backend sets it).
    park_worker_thread: ClassVar[bool] = False

    def __init__(
        self,
        vocab: Vocabulary,
        tokenizer: Any = None,
        *,
        max_batch_size: int = 32,
        max_wait_s: float = 0.0,
        cache_bytes: int = 256 * 2**20,
        name: str | None = None,
        max_context_length: int | None = None,
    ):
        if len(vocab) == 0:
            raise ValueError("a model needs a non-empty vocabulary")
        if max_context_length is not None and (
            not is_integer(max_context_length) or max_context_length < 1
        ):
            raise ValueError(
                f"max_context_length must be an integer >= 1 or None, got {max_context_length!r}"
            )
        #: The longest context accepted (None: no limit); checked by every request.
        self.max_context_length = max_context_length
        self._vocab = vocab
        #: ``len(vocab)``, read by every request's check without a call.
        self._vocab_size = len(vocab)
        self._tokenizer = tokenizer
        self.name = name or type(self).__name__
        self.worker = ModelWorker(f"genlm-{self.name}", park=self.park_worker_thread)
        # A model dropped without close() must not leave its thread idling forever. The
        # finalizer holds the worker, never the model, so it cannot keep the model alive.
        # Not at exit: the worker's own exit stop (``_worker._stop_at_exit``) ends every
        # started thread then, its running call first, before the interpreter finalizes
        # (a thread cut off inside torch or MLX then aborts the process).
        weakref.finalize(self, self.worker.close, wait=False).atexit = False
        budget = checked_count("cache_bytes", cache_bytes, 0, whole_floats=True)
        self.output_cache = OutputCache(budget)
        # Held weakly: the batcher must not keep the model alive (a model dropped without
        # close() is freed by reference counting, its worker stopped by the finalizer).
        self.batcher: AutoBatcher[Request, np.ndarray] = AutoBatcher(
            weakref.WeakMethod(self._run_requests),
            self.worker,
            max_batch_size=max_batch_size,
            max_wait_s=max_wait_s,
            key=lambda request: request,
            group=operator.attrgetter("variant"),  # no Python frame per request
            on_results=self.output_cache.put_many,
        )
        self._closed = False
        self._close_lock = threading.Lock()
        self._release: concurrent.futures.Future[None] | None = None

    # ---- what a backend implements -------------------------------------------------

    @abc.abstractmethod
    def _logprobs_batch(self, contexts: list[tuple[int, ...]], variant: Hashable) -> np.ndarray:
        """Next-token log-probabilities for each context, shape ``(len(contexts), V)``.

        Runs on the model's worker thread, never on the event loop. Contexts are
        validated, distinct and non-empty; ``contexts`` is a new list for this call, the
        backend's to change (pad, sort, pop): core keeps the batch as it handed it over and
        checks the result against that, one row per context, in the given order.
        ``variant`` is what :meth:`_variant` returned when the requests were made (all
        requests of a batch share it). Rows must be
        normalized log-probabilities over ``len(self.vocab)`` tokens (``-inf`` for an
        impossible token; no NaN or ``+inf``): core rejects a batch that visibly breaks
        this (see :func:`check_rows`) with :class:`BackendError`, failing its waiters.
        Any exception raised here fails the batch's waiters only; the model keeps serving.
        """

    def _variant(self) -> Hashable:
        """What besides the context changes the result (e.g. the active adapter).

        It is part of every cache key and is captured when a request is made, so it must
        be hashable (a name, a tuple, a frozen object): an unhashable one (a dict) fails
        every request with a ``BackendError`` naming this hook.
        """
        return None

    def _served_variants(self) -> Collection[Hashable] | None:
        """The variants a request may name besides None (the base model): a backend with
        adapters returns their names (hf, vllm and mlx: the loaded LoRA adapters, maybe none
        yet); None, the default, when it has no variants at all."""
        return None

    def _check_variant(self, variant: Hashable) -> Hashable:
        """Validate a per-request ``variant=`` (on the caller, before queueing): None, or
        one of :meth:`_served_variants`.

        Raises:
            ValueError: the backend has no variants (:meth:`_served_variants` is None).
            UnknownVariantError: it has, but not this one (those loaded are listed); a
                ``KeyError`` and a ``ValueError``.
        """
        if variant is None:
            return variant
        served = self._served_variants()
        if served is None:
            raise ValueError(f"{self.name} has no variants (adapters); got variant={variant!r}")
        try:
            known = variant in served
        except TypeError:  # unhashable (a list): no variant's name, and no key either
            known = False
        if not known:
            loaded = ", ".join(sorted(map(repr, served))) or "none"
            raise UnknownVariantError(
                f"{self.name} has no variant (adapter) {variant!r}; loaded: {loaded}"
            )
        return variant

    def _clear_backend_cache(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Drop backend state such as KV caches (runs on the worker thread)."""

    def _close_backend(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Release backend resources (runs on the worker thread, once)."""

    def _close_on_worker(self) -> None:
        """The worker's last call at close: the backend's :meth:`_close_backend`. A mixin
        that keeps state for the backend (:class:`~genlm.core.backend.LoraAdapters`, its
        adapters) extends it to drop that state after the release, so no backend has to
        remember to."""
        self._close_backend()

    # ---- the AsyncLM protocol ------------------------------------------------------

    @property
    def vocab(self) -> Vocabulary:
        """The model's byte vocabulary; its length is the width of every row."""
        return self._vocab

    @property
    def byte_vocab(self) -> list[bytes]:
        """The bytes of every token id, in id order (a fresh list on each access)."""
        return list(self._vocab.tokens)

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the model was built with, or None."""
        return self._tokenizer

    @property
    def current_variant(self) -> Hashable:
        """The variant a request made now without ``variant=`` is computed under (e.g.
        the active LoRA adapter's name; None for the base model). Layers that cache what
        they derive from rows (genlm-bytes' masses) key it by this, as core's output
        cache keys rows.

        Raises:
            ModelClosedError: the model is closed.
            BackendError: the backend's ``_variant`` hook returned something unhashable.
        """
        return self._request_variant(CURRENT_VARIANT)

    def validate_request(
        self, token_ids: Sequence[int], variant: Hashable = CURRENT_VARIANT
    ) -> Request:
        """Check a request as every call does and return it as a :class:`Request`, which
        stands for the tuple ``(variant, ids)`` (unpacking, indexing, equality, hash).

        Every public method validates here, before anything is queued; a backend's own
        entry points (hf's ``cache_kv``, vllm's ``sample``) call it so that bad input fails
        the same way. The result, with the variant resolved (:meth:`_variant` by default,
        else what :meth:`_check_variant` accepts), is the key of the scheduler and cache.
        The variant is checked first, then the ids (see :meth:`validate_requests`).
        """
        variant = self._request_variant(variant)
        size = self._vocab_size
        if _make_request is not None:  # every single call: no list made around it
            longest = self.max_context_length or sys.maxsize
            request = _make_request(variant, token_ids, size, longest)
            if request is not None:
                return request
        return Request(variant, self._validate_ids(token_ids, size))

    def validate_requests(
        self, contexts: Sequence[Sequence[int]], variant: Hashable = CURRENT_VARIANT
    ) -> list[Request]:
        """:meth:`validate_request` for each context, with the variant resolved once (what
        a batch call costs per context is its ids' check alone).

        Where the C extension was built, ``make_request`` checks a list or tuple of valid
        ids, copies and hashes them in one pass; whatever it does not accept (numpy ints,
        bad input) is checked in Python, which converts it or names the problem.
        """
        if is_unordered(contexts) or not isinstance(contexts, Iterable):  # row i: contexts[i]
            raise TypeError(
                "contexts must be an ordered sequence (a list) of contexts, not a "
                f"{type(contexts).__name__}"
            )
        variant = self._request_variant(variant)
        size = self._vocab_size
        if _make_request is None:
            return [Request(variant, self._validate_at(i, c, size)) for i, c in enumerate(contexts)]
        longest = self.max_context_length or sys.maxsize
        return [
            request
            if (request := _make_request(variant, c, size, longest)) is not None
            else Request(variant, self._validate_at(i, c, size))
            for i, c in enumerate(contexts)
        ]

    def _validate_at(
        self, index: int, token_ids: Sequence[int], vocab_size: int
    ) -> tuple[int, ...]:
        """:meth:`_validate_ids` for ``contexts[index]`` of a batch call: an error names the
        context's index."""
        try:
            return self._validate_ids(token_ids, vocab_size)
        except InvalidContextError as exc:
            raise InvalidContextError(f"contexts[{index}]: {exc}") from None

    def _request_variant(self, variant: Hashable) -> Hashable:
        """The variant a request is made for, checked first (the model must be open).

        Raises:
            BackendError: :meth:`_variant` returned something unhashable (a dict): the
                backend's fault, named here rather than as a bare ``TypeError`` where the
                request is hashed.
        """
        if self._closed:
            raise ModelClosedError(f"{self.name} is closed")
        if variant is not CURRENT_VARIANT:
            return self._check_variant(variant)
        current = self._variant()
        if current is not None:  # the common case costs nothing more
            try:
                hash(current)
            except TypeError:
                raise BackendError(
                    f"{self._label()}: _variant() returned {current!r}, which is unhashable "
                    f"({type(current).__name__}); _variant must return a hashable variant "
                    "(it is part of every request's cache key)"
                ) from None
        return current

    def _validate_ids(self, token_ids: Sequence[int], vocab_size: int) -> tuple[int, ...]:
        """One context's ids as a tuple, checked against the vocabulary and the length limit."""
        ids = validate_context(token_ids, vocab_size)
        if self.max_context_length is not None and len(ids) > self.max_context_length:
            raise InvalidContextError(
                f"context of {len(ids)} tokens is longer than {self.name}'s maximum of "
                f"{self.max_context_length} tokens (max_context_length)"
            )
        return ids

    async def next_token_logprobs(
        self,
        token_ids: Sequence[int],
        *,
        variant: Hashable = CURRENT_VARIANT,
        output: Output = "numpy",
    ) -> Any:
        """Log-probabilities of the next token after ``token_ids``, shape ``(V,)``."""
        # The per-particle call of an SMC step: the default form is checked and returned
        # without a call (as_output returns a numpy row asked for as numpy as it is).
        if output != "numpy":
            check_output(output)
        request = self.validate_request(token_ids, variant)
        row = self.output_cache.get(request)
        if row is None:
            row = await self.batcher.submit(request)
        return row if output == "numpy" and type(row) is np.ndarray else as_output(row, output)

    def next_token_logprobs_sync(
        self,
        token_ids: Sequence[int],
        *,
        variant: Hashable = CURRENT_VARIANT,
        output: Output = "numpy",
    ) -> Any:
        """The blocking twin of :meth:`next_token_logprobs` (runs on the worker thread;
        inside a coroutine it would stall the event loop)."""
        check_output(output)
        row = self._rows_sync([self.validate_request(token_ids, variant)])[0]
        return as_output(row, output)

    def next_token_logprobs_uncached(
        self,
        token_ids: Sequence[int],
        *,
        variant: Hashable = CURRENT_VARIANT,
        output: Output = "numpy",
    ) -> Any:
        """A fresh row, computed now: the output cache is neither read nor filled.

        For checks of the backend itself (e.g. that cached rows equal fresh ones). It blocks
        like :meth:`next_token_logprobs_sync`; the backend may still resume from its own KV
        cache (the row then equals a full forward up to float rounding).
        """
        check_output(output)
        (row,) = self._rows_sync([self.validate_request(token_ids, variant)], cached=False)
        return as_output(row, output)

    async def batch_next_token_logprobs(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        variant: Hashable = CURRENT_VARIANT,
        output: Output = "numpy",
    ) -> Any:
        """One new row per context, shape ``(len(contexts), V)``, row ``i`` for ``contexts[i]``;
        computed concurrently, batched with other requests, each served from the cache
        when there."""
        check_output(output)
        requests = self.validate_requests(contexts, variant)  # validate all first
        # Cached rows, and the scheduler's own futures for the rest: awaited in turn, they
        # cost no task per context (the whole batch resolves together).
        rows: list[Any] = self.output_cache.get_many(requests)
        missing = [i for i, row in enumerate(rows) if row is None]
        futures = self.batcher.submit_many([requests[i] for i in missing])
        pending = list(zip(missing, futures))
        try:
            for i, future in pending:
                rows[i] = await future
        except BaseException:  # failed or cancelled: withdraw interest in the rest
            for _, future in pending:
                future.cancel()
            raise
        return stack_output(rows, len(self._vocab), output)

    def batch_next_token_logprobs_sync(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        variant: Hashable = CURRENT_VARIANT,
        output: Output = "numpy",
    ) -> Any:
        """The blocking twin of :meth:`batch_next_token_logprobs` (batches of at most
        ``max_batch_size`` on the worker thread)."""
        check_output(output)
        rows = self._rows_sync(self.validate_requests(contexts, variant))
        return stack_output(rows, len(self._vocab), output)

    def _rows_sync(self, requests: list[Request], cached: bool = True) -> list[Any]:
        """Rows of validated requests, in their stored form, computed on the worker thread
        by the scheduler's blocking path; ``cached=False`` neither reads nor fills the
        output cache."""
        if not cached:
            return self.batcher.run_sync(requests, notify=False)
        rows: list[Any] = self.output_cache.get_many(requests)
        missing = [r for r, row in zip(requests, rows) if row is None]
        if not missing:
            return rows
        computed = iter(self.batcher.run_sync(missing))
        return [row if row is not None else next(computed) for row in rows]

    def _run_requests(self, requests: list[Request]) -> BatchRows:
        """Worker-thread side of a batch: call the backend, check what it returns and make
        its rows: views of the batch, copied once unless :attr:`stable_batches`.

        Raises:
            BackendError: the rows have the wrong shape or type, or are not normalized
                log-probabilities (see :func:`check_rows`). The whole batch fails and
                nothing of it is cached: a backend that produced one bad row is suspect.
        """
        variant = requests[0].variant
        contexts = tuple(r.ids for r in requests)  # the batch as handed over, checked against
        generation = self.output_cache.generation  # read first: a clear from now on wins
        rows = self._check_batch(self._logprobs_batch(list(contexts), variant), contexts)
        rows.generation = generation
        return rows

    def _check_batch(self, out: Any, contexts: tuple[tuple[int, ...], ...]) -> BatchRows:
        """The backend's batch ``out`` as :class:`BatchRows`, checked (see
        :meth:`_run_requests`)."""
        expected = (len(contexts), self._vocab_size)
        if is_torch(out):  # rows stay on the backend's device
            rows = split_torch(out, expected, self._label(), self.stable_batches)
            check_rows(*row_summary(rows.batch), expected[1], contexts, self._label())
            return rows
        try:
            out = np.asarray(out)
        except ValueError as exc:  # ragged rows: the backend's fault, not the caller's
            raise BackendError(
                f"{self._label()}: backend returned rows numpy cannot stack ({exc}), "
                f"expected floats of shape {expected}"
            ) from exc
        if out.shape != expected or out.dtype.kind != "f":
            raise BackendError(
                f"{self._label()}: backend returned log-probabilities of shape {out.shape} "
                f"and dtype {out.dtype}, expected floats of shape {expected}"
            )
        rows = numpy_rows(out, self.stable_batches)
        check_rows(*row_summary(rows.batch), expected[1], contexts, self._label())
        return rows

    def _label(self) -> str:
        """Names the backend in error messages: class and model name."""
        return f"{type(self).__name__} {self.name!r}"

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
        *,
        variant: Hashable = CURRENT_VARIANT,
    ) -> list[int]:
        """Ancestral sampling; returns the new tokens, the EOS token included if one ended it.

        ``eos_token_ids=None`` uses ``vocab.eos_token_ids``; ``temperature=0`` is greedy;
        the same ``seed`` gives the same tokens (None draws fresh entropy). ``variant``
        selects the variant of every step, like a row request's; by default the model's
        current one when ``sample`` is called (a later ``set_lora`` does not change a
        sample already running). Sampling also
        stops, returning the tokens drawn so far, once the context (prompt and new tokens)
        is longer than :attr:`max_context_length`: the last token is drawn from a context
        of exactly that length, so at most ``max_context_length + 1 - len(prompt)`` tokens
        come back.
        """
        temperature = check_sampling_args(max_tokens, temperature)
        request = self.validate_request(prompt_token_ids, variant)
        eos, rng = eos_id_set(eos_token_ids, self._vocab.eos_token_ids), seeded_rng(seed)
        return await self._sample(request, max_tokens, eos, temperature, rng)

    async def _sample(
        self,
        request: Request,
        max_tokens: int,
        eos: frozenset[int],
        temperature: float,
        rng: np.random.Generator,
    ) -> list[int]:
        """Draw from the validated ``request``'s context on, every step under its variant."""
        context, variant = list(request.ids), request.variant
        generated: list[int] = []
        limit = self.max_context_length
        # Stop, like vLLM's length cap, rather than lose the tokens drawn so far when the
        # growing context would be refused.
        while len(generated) < max_tokens and (limit is None or len(context) <= limit):
            logprobs = await self.next_token_logprobs(context, variant=variant)
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
        *,
        variant: Hashable = CURRENT_VARIANT,
    ) -> list[list[int]]:
        """:meth:`sample` for each prompt (all under ``variant``), concurrently, every
        prompt checked first; prompt ``i`` draws from stream ``i`` of
        ``numpy.random.SeedSequence(seed).spawn``."""
        temperature = check_sampling_args(max_tokens, temperature)
        requests = self.validate_requests(prompts, variant)
        eos = eos_id_set(eos_token_ids, self._vocab.eos_token_ids)
        rngs = seed_streams(seed, len(requests))
        return await gather_all(
            self._sample(r, max_tokens, eos, temperature, rng) for r, rng in zip(requests, rngs)
        )

    def clear_cache(self) -> None:
        """Forget cached outputs and backend state (KV).

        No row computed before the call returns from the state it found reaches a request
        made afterwards (e.g. after the model's weights changed): the output cache is
        emptied now, and again on the worker right after the backend's state, behind every
        batch already handed over (one may have started after the first clear), and a
        later request never joins a batch that was in flight (it is computed anew).
        """
        self.output_cache.clear()
        try:
            if not self._closed:
                self.worker.call(self._clear_backend_and_rows)
        except ModelClosedError:  # closed meanwhile: the release drops that state anyway
            pass
        finally:  # also when the backend's clear raised: its state may have changed
            self.batcher.refuse_joins()

    def _clear_backend_and_rows(self) -> None:
        """Worker side of :meth:`clear_cache`: the backend's state, then the rows of the
        batches that ran before it (a batch that starts later records the new generation),
        those rows even when the backend's clear raised (it may have changed part of it)."""
        try:
            self._clear_backend_cache()
        finally:
            self.output_cache.clear()

    def _begin_close(self) -> concurrent.futures.Future[None]:
        """Start closing, once: refuse new requests, fail queued ones, and queue the
        backend's release on the worker right behind the calls already there as its last
        call (one step with the worker's close, so no batch can run after the release).
        Nothing here waits, so a cancelled :meth:`aclose` still releases the backend as soon
        as the batches handed to the worker end. Returns the release's future.
        """
        with self._close_lock:
            if self._release is None:
                self.batcher.reject_new()
                self._closed = True
                try:  # the release is the worker's last call: none can follow it
                    self._release = self.worker.close_after(self._close_on_worker)
                except ModelClosedError:  # the worker was closed directly: nothing to run on
                    self._release = concurrent.futures.Future()
                    self._release.set_result(None)
            return self._release

    async def aclose(self) -> None:
        """Fail queued requests, let the batches handed to the worker (running or waiting
        behind it) deliver, then release the backend and the worker.

        Idempotent, and safe to cancel: the release goes ahead anyway, and a later
        ``aclose()`` or ``close()`` returns once it is done.

        Raises:
            Exception: what the backend's ``_close_backend`` raised, if it did.
        """
        release = self._begin_close()
        await self.batcher.aclose()
        await self.worker.wait_stopped()  # the release ran before the worker stopped
        self._empty_cache()
        release.result()

    def close(self) -> None:
        """Blocking :meth:`aclose`, for code outside an event loop (or on any thread).

        Requests queued on any event loop fail with :class:`ModelClosedError`; the
        batches already handed to the worker finish and deliver first. Called on the worker
        thread itself (a backend closing its model), it starts the release, empties the
        output cache and returns without waiting for the release.
        """
        release = self._begin_close()
        if self.worker.on_worker_thread():
            self._empty_cache()
            return
        self.worker.close(wait=True)
        self._empty_cache()
        release.result()

    def _empty_cache(self) -> None:
        """Drop the cached rows and store no more (budget 0): a batch that was running on
        another event loop hands its rows back after the close, and a closed model must
        not keep them."""
        self.output_cache.clear()
        self.output_cache.resize(0)

    async def __aenter__(self) -> BatchedLM:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} vocab={len(self._vocab)}>"


#: Nats by which a row may miss normalization before the batch is rejected. float32
#: rounding is ~1e-6 nats; genlm-bytes' pruning margin (1e-4) assumes rows within rounding.
NORMALIZATION_TOLERANCE = 1e-3


def check_rows(
    row_max: np.ndarray,
    first_logsumexp: float,
    width: int,
    contexts: Sequence[tuple[int, ...]],
    label: str,
) -> None:
    """Check a ``(B, V)`` batch of backend rows from its summary; raise :class:`BackendError`.

    The summary (:func:`genlm.core._rows.row_summary`: each row's maximum and the first
    row's ``logsumexp``, summed in float64) is computed where the rows are, so rows on a GPU
    cost one ``max`` there and a copy of ``B + 1`` numbers to the host.

    Every row: no NaN, no ``+inf``, not every entry ``-inf`` (``-inf`` alone is the
    legitimate log-probability of an impossible token), and a maximum within
    ``[-log V, 0]`` (give or take :data:`NORMALIZATION_TOLERANCE`), which any normalized
    row satisfies and raw logits rarely do. The first row's ``logsumexp`` must also be 0
    within the tolerance, which catches a backend that never normalizes at the cost of one
    row. A single unnormalized row elsewhere in the batch whose maximum is in range goes
    unnoticed.

    Args:
        row_max: each row's maximum, shape ``(B,)`` (NaN where a row holds NaN).
        first_logsumexp: the first row's ``logsumexp``.
        width: the vocabulary size ``V``.
        contexts: the batch's contexts, for the message.
        label: names the backend in the message.

    Raises:
        BackendError: a row breaks one of the rules above.
    """
    tol = NORMALIZATION_TOLERANCE
    low = -math.log(width) - tol
    maxima = row_max.tolist()  # Python floats: a batch's few rows cost less than numpy calls
    bad = [i for i, top in enumerate(maxima) if not low <= top <= tol]  # NaN fails both
    if bad:
        i, top = bad[0], maxima[bad[0]]
        if math.isnan(top):
            problem = "holds NaN"
        elif top == np.inf:
            problem = "holds +inf"
        elif top == -np.inf:
            problem = "is -inf everywhere (no possible token)"
        elif top > 0:
            problem = f"holds a log-probability of {top:.4g} > 0 (raw logits?)"
        else:
            problem = f"has no log-probability above {top:.4g}, so its mass is below 1"
        more = f" ({len(bad) - 1} more bad rows)" if len(bad) > 1 else ""
        raise BackendError(
            f"{label}: row {i} of a batch of {len(row_max)} (context {_show(contexts[i])}) "
            f"{problem}{more}; backends must return finite, normalized log-probabilities"
        )
    if abs(first_logsumexp) > tol:
        raise BackendError(
            f"{label}: row 0 of a batch of {len(row_max)} (context {_show(contexts[0])}) "
            f"has total probability {np.exp(first_logsumexp):.6g}, not 1; backends must "
            "return normalized log-probabilities"
        )


def _show(context: tuple[int, ...]) -> str:
    """A context short enough for an error message."""
    if len(context) <= 8:
        return str(context)
    return f"of {len(context)} tokens ({', '.join(map(str, context[:4]))}, ..., {context[-1]})"
