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
    (``logsumexp == 0``), one entry per vocabulary token id. Arrays may be read-only
    (they can be shared with a cache): copy before modifying.

    The four log-probability methods also take two keywords (:class:`BatchedLM` has them):
    ``variant=`` selects what besides the context changes the distribution for this request
    only (hf: a LoRA adapter name, None for the base model; by default the model's current
    one), and ``output="torch"`` returns float32 torch tensors on the device the backend
    computed them on instead of numpy arrays (see ``genlm.core._rows``).
    """

    @property
    def vocab(self) -> Vocabulary:
        """The byte string of every token id."""

    @property
    def byte_vocab(self) -> list[bytes]:
        """``list(vocab.tokens)``, for convenience."""

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer, or None when it has none."""

    async def next_token_logprobs(self, token_ids: Sequence[int], **options: Any) -> np.ndarray:
        """Log-probabilities of the next token after ``token_ids``."""

    def next_token_logprobs_sync(self, token_ids: Sequence[int], **options: Any) -> np.ndarray:
        """The blocking twin of :meth:`next_token_logprobs`."""

    async def batch_next_token_logprobs(
        self, contexts: Sequence[Sequence[int]], **options: Any
    ) -> np.ndarray:
        """One row per context: shape ``(len(contexts), len(vocab))``."""

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
    ) -> list[int]:
        """Sample a continuation of at most ``max_tokens`` tokens, ending at an EOS token."""

    async def batch_sample(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[list[int]]:
        """:meth:`sample` for several prompts at once."""

    def clear_cache(self) -> None:
        """Forget every cached result and backend state (KV)."""

    async def aclose(self) -> None:
        """Release the model's resources; later requests raise ``ModelClosedError``."""

    async def __aenter__(self) -> AsyncLM: ...

    async def __aexit__(self, *exc_info: object) -> None: ...
