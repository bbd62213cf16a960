"""``StatefulTokenizedLM``: genlm-bytes 0.2's token context (``genlm.bytes.byte_lm.lm_state``).

The model is any token model (a :class:`genlm.core.AsyncLM`, ``genlm.backend``'s models
included); its rows are returned as it gives them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from genlm.core.backend import validate_context


class StatefulTokenizedLM:
    """A token model and a token context: ``state << token`` extends it, ``await
    state.logp_next()`` asks the model for the next token's log-probabilities.

    Args:
        model: the token model (``vocab`` and ``async next_token_logprobs``); its rows are
            returned as it gives them.
        context: token ids of the context, checked as genlm-core checks every context
            (:func:`genlm.core.backend.validate_context`): an empty one, a float, a bool, a
            string or an id outside the model's vocabulary raises ``InvalidContextError``
            (``int()`` would read 1.7 as 1).
        n_calls: how many times this state family has asked the model (informational).
        max_context_length: keep at most this many tokens of context (the most recent),
            None for no limit; below 1 raises ``ValueError``.
    """

    def __init__(
        self,
        model: Any,
        context: Sequence[int],
        n_calls: int = 0,
        max_context_length: int | None = None,
    ):
        if max_context_length is not None and max_context_length < 1:
            raise ValueError(f"max_context_length must be >= 1 or None, got {max_context_length}")
        self.model = model
        self.context = list(validate_context(context, len(model.vocab)))
        self.n_calls = n_calls
        self.max_context_length = max_context_length

    @classmethod
    def initial(
        cls,
        model: Any,
        initial_context: Sequence[int] | None = None,
        max_context_length: int | None = None,
    ) -> StatefulTokenizedLM:
        """The state at ``initial_context`` (default: the BOS token alone; ``ValueError``
        without one), with no model call made yet."""
        if initial_context is None:
            bos = model.vocab.bos_token_id
            if bos is None:
                raise ValueError("the vocabulary has no BOS token: give initial_context")
            initial_context = [bos]
        return cls(model, initial_context, max_context_length=max_context_length)

    def __lshift__(self, token: int) -> StatefulTokenizedLM:
        """The state with ``token`` (an int) appended, the oldest dropped past the limit."""
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError(f"a token id must be an int, got {token!r}")
        context = [*self.context, token]
        if self.max_context_length is not None:
            context = context[-self.max_context_length :]
        return StatefulTokenizedLM(self.model, context, self.n_calls, self.max_context_length)

    async def logp_next(self) -> Any:
        """The model's next-token log-probabilities after the context, as it returns them;
        counts the call in ``n_calls``."""
        self.n_calls += 1
        return await self.model.next_token_logprobs(self.context)

    def __repr__(self) -> str:
        vocab = self.model.vocab
        return "|".join(repr(vocab.tokens[t])[2:-1] for t in self.context)
