"""``StatefulTokenizedLM`` (the published API's token context) and which model a call means.

The published API passes a genlm-backend ``AsyncLM`` around. Here any of these works, by
one duck-typed rule (:func:`core_lm_of`): an object with a ``core_lm`` attribute (the
``genlm.backend`` facade, which wraps a genlm-core model) means that core model;
otherwise the object itself must be a token model (``vocab`` and ``async
next_token_logprobs``), e.g. any :class:`genlm.core.AsyncLM`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def core_lm_of(llm: Any) -> Any:
    """The genlm-core token model behind ``llm``.

    Args:
        llm: a genlm-core ``AsyncLM`` (anything with ``vocab`` and ``async
            next_token_logprobs(ids)``), or an object whose ``core_lm`` attribute is one
            (the ``genlm.backend`` facade's ``AsyncLM``).

    Returns:
        The model to compute with: ``llm.core_lm`` if present, else ``llm``.

    Raises:
        TypeError: neither ``llm`` nor its ``core_lm`` is a token model.
    """
    core = getattr(llm, "core_lm", llm)
    if not (hasattr(core, "vocab") and hasattr(core, "next_token_logprobs")):
        raise TypeError(
            f"expected a token language model (a genlm.core AsyncLM, or an object with a "
            f"'core_lm' attribute holding one, like genlm.backend's AsyncLM), got {llm!r}"
        )
    return core


class StatefulTokenizedLM:
    """A token model and a token context: ``state << token`` extends it, ``await
    state.logp_next()`` asks the model for the next token's log-probabilities.

    Args:
        model: the token model (see :func:`core_lm_of` for what is accepted); its rows are
            returned as it gives them.
        context: token ids of the context.
        n_calls: how many times this state family has asked the model (informational).
        max_context_length: keep at most this many tokens of context (the most recent),
            None for no limit.
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
        self.context = [int(t) for t in context]
        self.n_calls = n_calls
        self.max_context_length = max_context_length

    @classmethod
    def initial(
        cls,
        model: Any,
        initial_context: Sequence[int] | None = None,
        max_context_length: int | None = None,
    ) -> StatefulTokenizedLM:
        """The state at ``initial_context`` (default: the BOS token alone).

        Raises:
            ValueError: no context given and the vocabulary has no BOS token.
        """
        if initial_context is None:
            bos = core_lm_of(model).vocab.bos_token_id
            if bos is None:
                raise ValueError("the vocabulary has no BOS token: give initial_context")
            initial_context = [bos]
        return cls(model, initial_context, max_context_length=max_context_length)

    def __lshift__(self, token: int) -> StatefulTokenizedLM:
        """The state with ``token`` appended (the oldest tokens dropped past the limit)."""
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError(f"a token id must be an int, got {token!r}")
        context = [*self.context, token]
        if self.max_context_length is not None:
            context = context[-self.max_context_length :]
        return StatefulTokenizedLM(self.model, context, self.n_calls, self.max_context_length)

    async def logp_next(self) -> Any:
        """The model's next-token log-probabilities after the context (its own row type)."""
        self.n_calls += 1
        return await self.model.next_token_logprobs(self.context)

    def __repr__(self) -> str:
        vocab = core_lm_of(self.model).vocab
        return "|".join(repr(vocab.tokens[t])[2:-1] for t in self.context)
