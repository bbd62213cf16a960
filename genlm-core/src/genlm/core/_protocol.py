"""The ``AsyncLM`` protocol: what every GenLM language model offers its users."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from genlm.core._vocab import Vocabulary


@runtime_checkable
class AsyncLM(Protocol):
    """A token-level language model answering "log-probabilities of every next token".

        Rows are numpy ``float32`` arrays of shape ``(len(vocab),)``, one entry per token id,
        normalized (``logsumexp == 0`` up to float32 rounding: byte-level models built on top
        rely on it). They may be read-only, shared with a cache: copy before modifying.

        A context is a non-empty sequence of token ids, ints in ``range(len(vocab))``; raw
        text, an empty context or an id out of range raises ``InvalidContextError`` (a
        ``ValueError``) before anything is computed, and a batch call computes nothing if one
        of its contexts is bad. After ``aclose`` every request raises ``ModelClosedError`` (and
    ``clear_cache`` does nothing).

        Every GenLM backend (a :class:`~genlm.core.backend.BatchedLM`) satisfies this protocol, and
        ``isinstance(lm, AsyncLM)`` checks it at run time. Concurrent calls are batched:
        awaiting many requests at once is the fast path, never a hazard. Each ``_sync`` method
        is the blocking twin of its async namesake, for code without an event loop.

        The four log-probability methods also take two keywords (:class:`BatchedLM` has them):
        ``variant=`` selects what besides the context changes the distribution for this request
        only (hf: a LoRA adapter name, None for the base model; by default the model's current
        one), and ``output="torch"`` returns float32 torch tensors on the device the backend
        computed them on instead of numpy arrays. ``sample`` and ``batch_sample`` take
        ``variant=`` too: the variant of every step.
    """

    @property
    def vocab(self) -> Vocabulary:
        """The exact bytes of every token id, special tokens flagged."""

    @property
    def byte_vocab(self) -> list[bytes]:
        """``list(vocab.tokens)``: the bytes of each token id, for code expecting a list."""

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer, or None when it has none."""

    async def next_token_logprobs(self, token_ids: Sequence[int], **options: Any) -> np.ndarray:
        """The row of log-probabilities of the next token after ``token_ids``."""

    def next_token_logprobs_sync(self, token_ids: Sequence[int], **options: Any) -> np.ndarray:
        """The blocking twin of :meth:`next_token_logprobs`."""

    async def batch_next_token_logprobs(
        self, contexts: Sequence[Sequence[int]], **options: Any
    ) -> np.ndarray:
        """A ``(len(contexts), len(vocab))`` array, row ``i`` for ``contexts[i]``."""

    def batch_next_token_logprobs_sync(
        self, contexts: Sequence[Sequence[int]], **options: Any
    ) -> np.ndarray:
        """The blocking twin of :meth:`batch_next_token_logprobs`."""

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None,
        temperature: float = 1.0,
        seed: int | None = None,
        **options: Any,
    ) -> list[int]:
        """Ancestral sampling: the generated ids (an EOS included), without the prompt.

        ``eos_token_ids`` end the continuation (``None``: the vocabulary's EOS tokens);
        temperature 0 is greedy; ``seed=None`` draws from fresh entropy. A ``max_tokens`` or
        ``temperature`` of the wrong type raises ``TypeError``, out of range ``ValueError``.
        """

    async def batch_sample(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None,
        temperature: float = 1.0,
        seed: int | None = None,
        **options: Any,
    ) -> list[list[int]]:
        """:meth:`sample` for several prompts, their steps batched; one seed for all."""

    def clear_cache(self) -> None:
        """Forget every cached result and backend state (KV); results are unchanged. On a
        closed model, nothing (closing released it all)."""

    async def aclose(self) -> None:
        """Release the model; queued requests fail with ``ModelClosedError`` (those the
        backend already computes may still get their results), none is left pending.
        Idempotent."""

    async def __aenter__(self) -> AsyncLM: ...

    async def __aexit__(self, *exc_info: object) -> None: ...
