"""``ByteLM``: a token LM seen as a distribution over byte strings."""

from __future__ import annotations

from collections.abc import Sequence, Sized
from typing import Any

from genlm.bytes._beam import BeamState
from genlm.bytes._model import ByteModel
from genlm.core import InvalidContextError
from genlm.core.backend import validate_context


class ByteLM(ByteModel):
    """A beam-summing byte-level language model over any token-level ``AsyncLM``.

    The byte process: the token LM emits tokens after the prompt until an EOS token; the
    bytes are the concatenated token bytes. ``P(x)``, the probability that the bytes start
    with ``x``, sums over every token sequence whose bytes reach the end of ``x``. A beam
    state tracks candidates ``(token context, partial token = trie node, log weight)``;
    without pruning (``K=None``) it is exact, with pruning its ``logZ`` is a lower bound.

    Args:
        lm: any object with ``vocab`` (a :class:`genlm.core.Vocabulary`) and
            ``async next_token_logprobs(ids)`` returning normalized log-probabilities
            (any :class:`genlm.core.AsyncLM`, ``genlm.backend``'s models included). Rows
            may be float64, never cast down; a writeable numpy row or a torch row is
            copied once before it is kept (the LM may fill it again; its flags are never
            changed); torch rows are read on the host unless ``device_rows``.
        K: beam width: candidates kept before each step (None: no limit, exact).
        prune_threshold: also drop candidates whose share of the beam's mass is at most
            this (0 drops none). A new token boundary below it is never sent to the LM.
            Its share is counted as genlm-bytes 0.2 counts it: stepping by a byte, against
            the candidates that go on inside their tokens with that byte plus the new
            boundaries; in ``logp_next``, against the beam's mass plus the new boundaries,
            which counts a boundary twice (there a threshold of 0.5 or more drops every
            boundary, EOS included).
        eos: byte strings whose tokens end the sequence, e.g. ``[b"<|eot_id|>", b"\\n\\n"]``
            (special tokens match their literal). None: the vocabulary's EOS ids. While
            prefilling, EOS tokens that are ordinary text count as text.
        heal: when no candidate can take the next byte, re-split a candidate's partial
            token into shorter tokens so the bytes stay reachable (adaptive token healing).
        heal_max_backoff: most bytes moved out of the partial token (None: all of them).
        heal_max_splits: most extra tokens committed inside the moved bytes (None: no limit).
        cache_bytes: byte budget of the per-context mass cache.
        lookahead: while prefilling with a beam width ``K``, each forward pass also
            computes the LM rows that the next ``lookahead`` steps will probably need (a
            guess from the beam's weights), so about every other step runs no forward
            pass. Results never depend on it. 0 turns it off; larger values trade wasted
            rows (costly on big models) for fewer forward passes (what small ones cost).
        close_lm: close ``lm`` in :meth:`aclose` (for a model this object loaded).
        verbose: log each new beam (logger ``genlm.bytes._beam``, level INFO).
        device_rows: ask ``lm`` for torch rows (``output="torch"``) and compute their trie
            masses on the rows' device (float64, the trie's torch kernel); the beam then
            reads only the entries it needs (a node's mass, a few tokens' log-probabilities,
            the next-byte distribution), never a whole row. None (default): when ``lm`` keeps
            its rows on a device (its ``device_rows`` attribute: ``HFLM`` on a GPU).

    Bad options raise at construction: ``TypeError`` for an ``lm`` that is no token model or
    an ``eos`` that is one string instead of a list, ``ValueError`` for values out of range
    or an ``eos`` string that is not exactly the bytes of a token.

    A prompt is token ids or bytes. Token ids are the context as given (non-empty;
    checked by :func:`genlm.core.backend.validate_context`, as core checks every context,
    so bad ids raise ``InvalidContextError``). Bytes (``bytes``, ``bytearray``,
    ``memoryview``; or text, UTF-8 encoded) start from the BOS token and are prefilled byte
    by byte, summing over their tokenizations; a vocabulary without BOS uses the prompt's
    first token (longest match) as the context instead (``ValueError`` if none matches).
    """

    async def initial(self, prompt: Sequence[int] | bytes | str = b"") -> BeamState:
        """The state after a prompt: token ids, or bytes/text (see the class)."""
        if isinstance(prompt, str):
            prompt = prompt.encode("utf-8")
        if isinstance(prompt, (bytes, bytearray, memoryview)):
            data = bytes(prompt)
            bos = self.lm.vocab.bos_token_id
            if bos is not None:
                context: tuple[int, ...] = (bos,)
            else:
                first = self._longest_token(data)
                context = (first,)
                data = data[len(self.lm.vocab.tokens[first]) :]
            state = BeamState.at_context(self, context)
            return await state.prefill(data) if data else state
        if isinstance(prompt, Sized) and len(prompt) == 0:
            raise InvalidContextError(
                "empty token context: start from the BOS token or give prompt bytes"
            )
        # Core's check: no floats (2.5 became 2), bools, sets or dicts as token ids.
        return BeamState.at_context(self, validate_context(prompt, len(self.lm.vocab)))

    @classmethod
    async def from_prompt(
        cls, lm: Any, prompt: Sequence[int] | bytes | str = b"", **options: Any
    ) -> BeamState:
        """``await ByteLM(lm, **options).initial(prompt)``; close it with the state's ``aclose``."""
        return await cls(lm, **options).initial(prompt)
