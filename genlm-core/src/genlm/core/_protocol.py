"""The ``AsyncLM`` protocol: what every GenLM language model offers its users."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from genlm.core._vocab import Vocabulary


@runtime_checkable
class AsyncLM(Protocol):
    """A token-level language model answering "log-probabilities of every next token".

    Log-probabilities are numpy ``float32`` arrays of shape ``(len(vocab),)``, normalized
    (``logsumexp == 0`` up to float32 rounding; byte-level models built on top rely on
    it), one entry per vocabulary token id. Arrays may be read-only (they can be shared
    with a cache): copy before modifying.

    Every GenLM backend (a :class:`~genlm.core.backend.BatchedLM`) satisfies this protocol, and
    ``isinstance(lm, AsyncLM)`` checks it at run time. Concurrent calls are batched:
    awaiting many requests at once is the fast path, never a hazard.

    The four log-probability methods also take two keywords (:class:`BatchedLM` has them):
    ``variant=`` selects what besides the context changes the distribution for this request
    only (hf: a LoRA adapter name, None for the base model; by default the model's current
    one), and ``output="torch"`` returns float32 torch tensors on the device the backend
    computed them on instead of numpy arrays (see ``genlm.core._rows``).
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
        """Log-probabilities of the next token after ``token_ids``.

        Args:
            token_ids: the context, a non-empty sequence of token ids (ints in
                ``range(len(vocab))``; raw text is refused).
            **options: ``variant=`` and ``output=``, as :class:`~genlm.core.backend.BatchedLM`
                takes them.

        Returns:
            A read-only float32 row of shape ``(len(vocab),)``, normalized.

        Raises:
            InvalidContextError: the context is empty, not integers, or out of range.
            ModelClosedError: the model was closed.
        """

    def next_token_logprobs_sync(self, token_ids: Sequence[int], **options: Any) -> np.ndarray:
        """The blocking twin of :meth:`next_token_logprobs`, for code without an event loop.

        Args:
            token_ids: the context, as for :meth:`next_token_logprobs`.
            **options: ``variant=`` and ``output=``, as :class:`~genlm.core.backend.BatchedLM`
                takes them.

        Returns:
            The same row :meth:`next_token_logprobs` returns.

        Raises:
            InvalidContextError: the context is unusable.
            ModelClosedError: the model was closed.
        """

    async def batch_next_token_logprobs(
        self, contexts: Sequence[Sequence[int]], **options: Any
    ) -> np.ndarray:
        """Log-probabilities after each of several contexts, in one call.

        Args:
            contexts: token-id contexts, each as for :meth:`next_token_logprobs`.
            **options: ``variant=`` and ``output=``, as :class:`~genlm.core.backend.BatchedLM`
                takes them.

        Returns:
            A float32 array of shape ``(len(contexts), len(vocab))``, row ``i`` for
            ``contexts[i]``.

        Raises:
            InvalidContextError: one of the contexts is unusable (nothing is computed).
            ModelClosedError: the model was closed.
        """

    def batch_next_token_logprobs_sync(
        self, contexts: Sequence[Sequence[int]], **options: Any
    ) -> np.ndarray:
        """The blocking twin of :meth:`batch_next_token_logprobs`.

        Args:
            contexts: token-id contexts, each as for :meth:`next_token_logprobs`.
            **options: ``variant=`` and ``output=``, as :class:`~genlm.core.backend.BatchedLM`
                takes them.

        Returns:
            The same array :meth:`batch_next_token_logprobs` returns.

        Raises:
            InvalidContextError: one of the contexts is unusable.
            ModelClosedError: the model was closed.
        """

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        """Sample a continuation token by token (ancestral sampling).

        Args:
            prompt_token_ids: the prompt, as for :meth:`next_token_logprobs`.
            max_tokens: the most tokens to generate (``>= 0``).
            eos_token_ids: tokens that end the continuation (included in the result),
                or None to always generate ``max_tokens`` tokens.
            temperature: divides the log-probabilities before drawing; 0 is greedy.
            seed: makes the draw reproducible; None draws from fresh entropy.

        Returns:
            The generated token ids, without the prompt.

        Raises:
            InvalidContextError: the prompt is unusable.
            ValueError: ``max_tokens`` or ``temperature`` is out of range.
            ModelClosedError: the model was closed.
        """

    async def batch_sample(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[list[int]]:
        """:meth:`sample` for several prompts at once; their steps are batched together.

        Args:
            prompts: one prompt per continuation.
            max_tokens: as for :meth:`sample`.
            eos_token_ids: as for :meth:`sample`.
            temperature: as for :meth:`sample`.
            seed: seeds the whole batch reproducibly; None draws from fresh entropy.

        Returns:
            One list of generated token ids per prompt, in order.

        Raises:
            InvalidContextError: a prompt is unusable.
            ValueError: ``max_tokens`` or ``temperature`` is out of range.
            ModelClosedError: the model was closed.
        """

    def clear_cache(self) -> None:
        """Forget every cached result and backend state (KV); results are unchanged."""

    async def aclose(self) -> None:
        """Release the model's resources; later requests raise ``ModelClosedError``.

        Queued requests fail with ``ModelClosedError``; calling it again does nothing.
        """

    async def __aenter__(self) -> AsyncLM: ...

    async def __aexit__(self, *exc_info: object) -> None: ...
