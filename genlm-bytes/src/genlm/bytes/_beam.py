"""``BeamState``: the beam of tokenizations consistent with the bytes so far.

A candidate is ``(token context, partial token, log weight)``: the context's tokens
spell a prefix of the bytes ``x`` consumed so far and the partial token (a trie node)
spells the rest. Its weight is ``log P(context tokens) + log mass[node]``: the
probability of every token sequence that continues the context with a token starting
with the partial bytes. These events are disjoint and cover ``P(x)``, so the weights
sum to ``P(x)`` exactly when nothing is pruned.

The next byte ``b`` is reached two ways: inside the partial token (the node's child
``b``), or by completing a token that ends exactly at the node and starting a new one
with ``b`` (a *boundary*). Boundaries need the LM's distribution after the longer
context; all of a step's boundaries are requested at once, so the LM batches them.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Self

import attrs
import numpy as np

from genlm.bytes._dist import EOS, NextByteLogprobs, checked_rng, is_index, logsumexp
from genlm.bytes._heal import heal
from genlm.bytes._model import AsyncClosing, ByteModel
from genlm.bytes._types import Candidate
from genlm.core.backend import check_temperature, checked_count, seeded_rng

if TYPE_CHECKING:
    from collections.abc import Coroutine

logger = logging.getLogger(__name__)

#: Nats by which a boundary's weight must fall below the ``K``-th candidate's before a step
#: skips its LM call: the LM's float32 rows may sum to slightly more than 1, so a boundary's
#: next-byte mass can exceed 0 by float rounding (~1e-6 nats), never by this much.
_ROUNDING_MARGIN = 1e-4


class UnreachableByteError(ValueError):
    """No candidate of the beam (and no healing) can produce the requested byte."""


@attrs.frozen(slots=True)
class GeneratedBytes:
    """What :meth:`BeamState.sample` produced.

    Attributes:
        data: the bytes generated (EOS excluded).
        state: the state after them.
        eos: whether generation ended by drawing EOS.
        logp: log-probability of the choices under the distributions they were drawn from
            (:meth:`NextByteLogprobs.tempered` at the sampling temperature: renormalized over
            bytes and EOS; 0 for greedy choices).
        at_limit: whether generation stopped because the next byte's distribution needs a
            token context longer than the token model's ``max_context_length``.
    """

    data: bytes
    state: BeamState
    eos: bool
    logp: float
    at_limit: bool = False


class BeamState(AsyncClosing):
    """The byte-level LM after some bytes: a beam of candidates. Immutable.

    Make one with :meth:`ByteLM.initial` or :meth:`ByteLM.from_prompt`. ``await
    state.advance(b)`` (or ``await (state << b)``) returns the state after byte ``b``;
    ``await state.logp_next()`` gives the next symbol's distribution. Both work on the
    pruned beam (:meth:`prune`: the ``K`` heaviest candidates whose share of the mass is
    above the threshold), so a step costs at most ``K`` LM contexts; with ``prune=False``
    they work on the beam as it is, and the caller prunes. A state makes its successors
    of its own class (:meth:`_derive`, through :meth:`_make`), so a subclass's states stay of
    that class.

    The methods that ask the token LM for rows raise its errors (e.g.
    ``InvalidContextError`` for a token id outside the vocabulary) as they are; once the
    model is closed, a
    method that needs masses it has not computed yet raises :class:`ByteLMClosedError`.
    A byte that is not an int in 0..255 raises ``ValueError``; one that no candidate (nor
    healing, when on) can produce raises :class:`UnreachableByteError`. Every method
    returns a new state (or this one when nothing changes).

    Args:
        byte_lm: the model whose trie, masses and options the state uses (shared by
            every state made from it).
        candidates: the beam; kept sorted by weight, heaviest first.
        data: the bytes consumed since the prompt.
        eos_mode: False while prefilling: EOS tokens that are ordinary text count as text.
    """

    def __init__(
        self,
        byte_lm: ByteModel,
        candidates: Sequence[Candidate],
        data: bytes = b"",
        eos_mode: bool = True,
    ):
        self.byte_lm = byte_lm
        self.candidates: tuple[Candidate, ...] = tuple(sorted(candidates, key=lambda c: -c.weight))
        #: The bytes consumed since the prompt.
        self.data = data
        #: False while prefilling: EOS tokens that are ordinary text count as text.
        self.eos_mode = eos_mode
        weights = np.array([c.weight for c in self.candidates])
        #: log of the beam's total weight: ``log P(data)`` when nothing was pruned, else a
        #: lower bound.
        self.logZ = logsumexp(weights)
        self._boundaries: list[Candidate] | None = None

    @classmethod
    def at_context(cls, byte_lm: ByteModel, context: tuple[int, ...]) -> Self:
        """One candidate of weight 0 at a token boundary right after ``context`` (not
        checked here: the token LM validates it when first asked)."""
        return cls._make(byte_lm, [Candidate(context, 0.0, byte_lm.trie.root, None, 0.0)])

    @classmethod
    def _make(
        cls,
        byte_lm: ByteModel,
        candidates: Sequence[Candidate],
        data: bytes = b"",
        eos_mode: bool = True,
    ) -> Self:
        """A state of this class from the constructor's arguments: where every state is
        made, so a subclass whose own constructor takes other arguments overrides it."""
        return cls(byte_lm, candidates, data, eos_mode)

    # ---- the beam ----------------------------------------------------------------------

    def prune(self) -> Self:
        """Keep the ``K`` heaviest candidates whose share of ``exp(logZ)`` exceeds the threshold."""
        K, threshold = self.byte_lm.K, self.byte_lm.log_prune_threshold
        kept = [c for c in self.candidates if c.weight - self.logZ > threshold]
        if K is not None:
            kept = kept[:K]
        if len(kept) == len(self.candidates):
            return self
        return self._derive(kept)

    def _derive(
        self,
        candidates: Sequence[Candidate],
        data: bytes | None = None,
        eos_mode: bool | None = None,
    ) -> Self:
        """A state of this class and model: ``candidates``, after ``data`` (default: this
        state's bytes), in ``eos_mode`` (default: this state's)."""
        return self._make(
            self.byte_lm,
            candidates,
            self.data if data is None else data,
            self.eos_mode if eos_mode is None else eos_mode,
        )

    async def boundaries(
        self,
        above: float = -np.inf,
        prefetch: Sequence[tuple[int, ...]] = (),
        logZ: float | None = None,
    ) -> list[Candidate]:
        """Candidates at a token boundary right after ``data``, with their LM masses.

        Every candidate whose partial token is a whole token (or several ids with those
        bytes) completes it; a new boundary whose share of the mass (``logZ``, by default
        the beam's, plus the new boundaries') is at most the prune threshold is dropped
        before the LM is asked, and so is one whose weight is at most ``above`` (its weight
        bounds every candidate it can lead to, so a caller that knows ``K`` heavier ones
        need not ask the LM). ``prefetch``: more contexts for the same LM batch (for later
        steps), if the LM is asked at all. Cached on the state when ``above`` is -inf and
        the set does not depend on ``logZ`` (the default one, or no threshold).
        """
        shared = logZ is None or self.byte_lm.log_prune_threshold == -np.inf
        if self._boundaries is not None and shared:
            return [b for b in self._boundaries if b.logp > above]
        found = [(ctx, w) for ctx, w in self._boundary_contexts(logZ) if w > above]
        nexts = await self.byte_lm.next_tokens([ctx for ctx, _ in found], self.eos_mode, prefetch)
        root = self.byte_lm.trie.root
        bounds = [Candidate(ctx, logp, root, nxt, logp) for (ctx, logp), nxt in zip(found, nexts)]
        if above == -np.inf and shared:
            self._boundaries = bounds
        return bounds

    def _boundary_contexts(
        self, logZ: float | None = None, roots: bool = True, threshold: float | None = None
    ) -> list[tuple[tuple[int, ...], float]]:
        """``(context, log weight)`` of each token boundary after ``data`` above the threshold.

        A new boundary (a candidate completing its token) is kept if its share of the mass
        exceeds the threshold; the mass is ``logZ`` (default: the beam's) plus the new
        boundaries', as genlm-bytes 0.2 counts it. ``roots``: also include the candidates
        already at a boundary, as they are: they are part of ``logZ`` already, and
        :meth:`prune` applied the threshold to them. ``threshold``: the log threshold
        (default: the model's; -inf keeps every boundary).
        """
        trie = self.byte_lm.trie
        # (context, log weight, whether it is a new boundary), in the beam's order
        found: list[tuple[tuple[int, ...], float, bool]] = []
        for c in self.candidates:
            if c.node == trie.root:
                if roots:
                    found.append((c.context, c.logp, False))
                continue
            row = c.next.logp
            for token in trie.tokens_at(c.node).tolist():
                logp = c.logp + float(row[token])
                if logp > -np.inf:
                    found.append((c.context + (token,), logp, True))
        if threshold is None:
            threshold = self.byte_lm.log_prune_threshold
        new = [w for _, w, is_new in found if is_new]
        if threshold > -np.inf and new:
            base = self.logZ if logZ is None else logZ
            total = np.logaddexp(base, logsumexp(np.array(new)))
            return [(ctx, w) for ctx, w, is_new in found if not is_new or w - total > threshold]
        return [(ctx, w) for ctx, w, _ in found]

    # ---- stepping ----------------------------------------------------------------------

    async def advance(self, byte: int, prune: bool = True) -> Self:
        """The state after one more byte, from the pruned beam unless ``prune=False``;
        heals if the beam would empty."""
        beam = self.prune() if prune else self
        return await beam._advance(byte, only_survivors=False)

    async def _advance(self, byte: int, only_survivors: bool, upcoming: bytes = b"") -> Self:
        """:meth:`advance` from this beam as it is (the callers prune); with
        ``only_survivors``, leave out the new candidates that the next step's :meth:`prune`
        surely drops, sparing their LM calls.

        A boundary's weight after the byte is at most its weight before, so once ``K``
        candidates inside their tokens are heavier (by a margin above float rounding of
        the LM's rows), the boundary cannot reach the top ``K``. The result then has the
        same pruned beam as :meth:`advance`'s, but not its ``logZ``: only for stepping on.

        ``upcoming``: the bytes the caller will advance by next (prefill knows them). The
        token boundaries the next ``byte_lm.lookahead`` steps will likely need are then
        sent with this step's, so those steps usually find their LM rows cached and cost
        no forward pass.
        """
        if not is_index(byte, 256):
            raise ValueError(f"expected a byte value 0..255, got {byte!r}")
        byte = int(byte)
        byte_lm = self.byte_lm
        trie = byte_lm.trie
        root = trie.root
        new: list[Candidate] = []
        for c in self.candidates:
            if c.node == root:
                continue
            child = trie.child(c.node, byte)
            if child is not None:
                weight = c.logp + float(c.next.mass[child])
                if weight > -np.inf:
                    new.append(Candidate(c.context, c.logp, child, c.next, weight))
        start = trie.child(root, byte)
        logZ = None
        if start is not None:
            above = -np.inf
            K = byte_lm.K
            if only_survivors and K is not None and len(new) >= K:
                if byte_lm.log_prune_threshold == -np.inf:
                    kth = sorted((c.weight for c in new), reverse=True)[K - 1]
                    above = kth - _ROUNDING_MARGIN
            prefetch: list[tuple[int, ...]] = []
            if K is not None and byte_lm.lookahead and upcoming:
                ahead = upcoming[: byte_lm.lookahead - 1]
                prefetch = _likely_boundaries(self, new, start, above, K, ahead)
            # The mass a new boundary's share is of, as genlm-bytes 0.2 steps: the
            # candidates going on inside their tokens with this byte (plus the boundaries).
            if byte_lm.log_prune_threshold > -np.inf:
                logZ = logsumexp(np.array([c.weight for c in new])) if new else -np.inf
            for b in await self.boundaries(above, prefetch, logZ):
                weight = b.logp + float(b.next.mass[start])
                if weight > -np.inf:
                    new.append(Candidate(b.context, b.logp, start, b.next, weight))
        if not new:
            if self.byte_lm.heal:
                new = await heal(byte_lm, self.candidates, self.eos_mode, byte)
            if not new:
                raise UnreachableByteError(
                    # "Beam became empty" is genlm-bytes 0.2's wording, which clients match
                    f"Beam became empty: no candidate of the beam can produce byte "
                    f"{bytes([byte])!r} after {_tail(self.data)}"
                    + ("" if self.byte_lm.heal else " (healing is off)")
                    + self._threshold_note(start is not None, logZ)
                )
            logger.debug("healed the beam to reach byte %r", bytes([byte]))
        state = self._derive(new, self.data + bytes([byte]))
        if byte_lm.verbose:
            logger.info("after byte %r:\n%r", bytes([byte]), state)
        return state

    def _threshold_note(self, starts_token: bool, logZ: float | None) -> str:
        """What ``prune_threshold`` took from a step that reached no candidate (an error
        path only): every candidate (the pruned beam is empty), or the new token boundaries
        it dropped before the LM was asked, which might have started a token with the
        byte (``starts_token``: some token starts with it)."""
        threshold = self.byte_lm.prune_threshold
        if not threshold:
            return ""
        if not self.candidates:
            return f"; prune_threshold={threshold} dropped every candidate of the beam"
        if not starts_token:
            return ""
        kept = len(self._boundary_contexts(logZ, roots=False))
        dropped = len(self._boundary_contexts(logZ, roots=False, threshold=-np.inf)) - kept
        if not dropped:
            return ""
        return (
            f"; prune_threshold={threshold} dropped {dropped} new token boundar"
            f"{'y' if dropped == 1 else 'ies'} (share of the mass at most the threshold)"
            " that might have produced it"
        )

    def __lshift__(self, byte: int) -> Coroutine[Any, Any, Self]:
        """``await (state << b)`` is ``await state.advance(b)``."""
        return self.advance(byte)

    async def prefill(self, data: bytes) -> Self:
        """Advance over ``data``; EOS tokens that are ordinary text count as text meanwhile.

        Like :meth:`advance` over each byte, but the intermediate states leave out the
        candidates the next step prunes (sparing their LM calls) and fetch rows ahead
        (see ``ByteLM``'s ``lookahead``). When some EOS token is ordinary text, the bytes
        are consumed with it counted as text, and the result is switched back to EOS mode:
        such a token ending exactly at the end of ``data`` was text, so it is committed
        (its candidate is at the token boundary after it).

        Raises:
            TypeError: ``data`` is not bytes (``bytes``, ``bytearray``, ``memoryview``, or
                byte values: a list or a numpy integer array, read by value): text (encode
                it first: ``ByteLM.initial`` takes text as UTF-8, a step does not guess), an
                int (``bytes(3)`` would be three NUL bytes), or a value that is no integer
                (a float, a bool).
            ValueError: a byte value outside 0..255.
        """
        data = _checked_bytes(data)
        text_mode = self.byte_lm.has_text_eos
        state = await self.with_eos_mode(False) if text_mode else self
        for i, byte in enumerate(data):
            # Only the last state is returned: the ones before it need only their survivors.
            last = i == len(data) - 1
            upcoming = b"" if last else data[i + 1 :]
            state = await state.prune()._advance(byte, only_survivors=not last, upcoming=upcoming)
        return state._end_prefill() if text_mode else state

    def _end_prefill(self) -> Self:
        """This state (prefilled with text EOS tokens as text) in EOS mode, its bytes still
        text: a text EOS token that a candidate's partial token spells exactly ends the
        prompt as text, so it is committed; :meth:`_in_mode` alone would drop its mass,
        which EOS-mode masses leave out."""
        root = self.byte_lm.trie.root
        eos_ids = set(self.byte_lm.masked_ids(True).tolist())  # only text ones are at nodes
        ended = []
        for c in self.candidates:
            if c.node == root:
                continue
            for token in self.byte_lm.trie.tokens_at(c.node).tolist():
                logp = c.logp + float(c.next.logp[token]) if token in eos_ids else -np.inf
                if logp > -np.inf:
                    ended.append(Candidate(c.context + (token,), logp, root, None, logp))
        moved = self._in_mode(True).candidates
        if self.candidates and not moved and not ended:
            # Every tokenization leaves the prompt inside a token that is EOS from here on.
            raise UnreachableByteError(
                f"nothing can follow the prompt {_tail(self.data)}: its last bytes start only"
                " tokens that end the sequence (EOS tokens count as text only while"
                " prefilling)"
            )
        return self._derive([*moved, *ended], eos_mode=True)

    async def with_eos_mode(self, eos_mode: bool) -> Self:
        """The same candidates re-weighted for ``eos_mode`` (False: text EOS tokens count
        as text, see :meth:`prefill`); no LM call: each candidate's masses are recomputed
        from the LM row it holds, and candidates that become impossible are dropped.

        Raises:
            UnreachableByteError: every candidate becomes impossible (each is inside a
                token that is EOS in EOS mode): no text can follow this state's bytes.
        """
        state = self._in_mode(eos_mode)
        if self.candidates and not state.candidates:
            raise UnreachableByteError(
                f"no candidate of the state after {_tail(self.data)} remains possible with"
                f" eos_mode={eos_mode}: each is inside a token that ends the sequence"
            )
        return state

    def _in_mode(self, eos_mode: bool) -> Self:
        if eos_mode == self.eos_mode:
            return self
        trie = self.byte_lm.trie
        root = trie.root
        # Back to text mode right after a prefill: a text EOS token that
        # :meth:`_end_prefill` committed (a root candidate after it) is again part of the
        # mass of the in-token candidate it was committed from. Keep that one only, or
        # the tokenization is counted twice (a second prefill raised logZ above 0).
        committed_from = set()
        if not eos_mode:
            committed_from = {(c.context, c.node) for c in self.candidates if c.node != root}
        text_eos = self.byte_lm.text_eos_ids
        moved = []
        for c in self.candidates:
            if c.node == root:
                last = c.context[-1] if c.context else None
                if last in text_eos and (c.context[:-1], trie.token_node[last]) in committed_from:
                    continue
                moved.append(attrs.evolve(c, next=None))
                continue
            n = self.byte_lm.in_mode(c.context, c.next, eos_mode)
            weight = c.logp + float(n.mass[c.node])
            if weight > -np.inf:
                moved.append(Candidate(c.context, c.logp, c.node, n, weight))
        return self._derive(moved, eos_mode=eos_mode)

    async def logp_next(self, prune: bool = True) -> NextByteLogprobs:
        """The next symbol's :class:`NextByteLogprobs`, on the pruned beam (unless
        ``prune=False``) normalized by its mass: exact conditionals when nothing is pruned."""
        beam = self.prune() if prune else self
        if not beam.candidates:  # a threshold can drop candidates of equal shares alike
            raise UnreachableByteError(
                f"the beam after {_tail(self.data)} is empty: prune_threshold="
                f"{self.byte_lm.prune_threshold} dropped every candidate"
            )
        trie = self.byte_lm.trie
        symbols: list[np.ndarray] = []
        values: list[np.ndarray] = []
        for c in beam.candidates:
            if c.node == trie.root:
                continue
            lo, hi = int(trie.child_start[c.node]), int(trie.child_stop[c.node])
            if hi > lo:
                symbols.append(trie.edge[lo:hi])
                values.append(c.logp + c.next.mass[lo:hi])
        lo, hi = self.byte_lm._root_lo, self.byte_lm._root_hi
        bounds = await beam.boundaries()
        if bounds:
            root_edges = trie.edge[lo:hi]
            for b in bounds:
                symbols.append(root_edges)
                values.append(b.logp + b.next.mass[lo:hi])
            symbols.append(np.full(len(bounds), EOS, dtype=trie.edge.dtype))
            values.append(np.array([b.logp + b.next.log_eos for b in bounds]))
        out = _scatter_logsumexp(symbols, values, EOS + 1) - beam.logZ
        log_eot = logsumexp(np.array([b.logp for b in bounds])) - beam.logZ
        return NextByteLogprobs(out, float(log_eot))

    # ---- generation --------------------------------------------------------------------

    async def sample(
        self,
        max_bytes: int,
        *,
        seed: int | None = None,
        rng: np.random.Generator | None = None,
        temperature: float = 1.0,
        on_step: Callable[[int], None] | None = None,
    ) -> GeneratedBytes:
        """Draw up to ``max_bytes`` bytes, one at a time, stopping at EOS.

        Each symbol is drawn from :meth:`logp_next` renormalized over bytes and EOS (see
        :meth:`NextByteLogprobs.sample`). The same seed gives the same bytes;
        ``temperature=0`` is :meth:`greedy`. It also stops, keeping what it drew
        (``at_limit``), where the next byte's distribution would need a token context
        longer than the token model's ``max_context_length`` (for one tokenization is
        enough: its mass could not be counted). ``rng`` (default: a new generator from
        ``seed``) draws every symbol. ``on_step`` is called after each byte drawn with the
        number drawn so far (progress bars: ``genlm bytes --sample``), as
        :func:`genlm.core.smc.smc` calls its own after each step.

        Raises:
            TypeError: ``max_bytes`` is not an integer (a bool, a float, None), or
                ``temperature`` is not a real number: checked before anything is drawn,
                as core's ``sample`` checks ``max_tokens`` and ``temperature``.
            ValueError: ``max_bytes`` < 0, or a temperature
                :func:`genlm.core.backend.check_temperature` refuses.
            TypeError, ValueError: a ``seed`` that is not None or an integer >= 0
                (:func:`genlm.core.backend.seeded_rng`), an ``rng`` without a numpy
                ``Generator``'s ``choice`` method; both name the argument.
        """
        max_bytes = checked_count("max_bytes", max_bytes, 0)
        temperature = check_temperature(temperature)
        rng = seeded_rng(seed) if rng is None else checked_rng(rng)
        limit = getattr(self.byte_lm.lm, "max_context_length", None)
        state, out, total = self, bytearray(), 0.0
        for _ in range(max_bytes):
            if limit is not None and not state._next_fits(limit):
                return GeneratedBytes(bytes(out), state, False, total, at_limit=True)
            dist = await state.logp_next(prune=True)
            symbol = dist.sample(rng, temperature)
            total += float(dist.tempered(temperature)[symbol])
            if symbol == EOS:
                return GeneratedBytes(bytes(out), state, True, total)
            out.append(symbol)
            state = await state.advance(symbol, prune=True)
            if on_step is not None:
                on_step(len(out))
        return GeneratedBytes(bytes(out), state, False, total)

    def _next_fits(self, limit: int) -> bool:
        """Whether :meth:`logp_next` (and then :meth:`advance`) ask for no context over
        ``limit`` tokens: the contexts are the beam's token boundaries, known without an
        LM call."""
        beam = self.prune()
        if all(len(c.context) < limit for c in beam.candidates):
            return True  # a boundary adds one token to its candidate's context
        return all(len(context) <= limit for context, _ in beam._boundary_contexts())

    async def greedy(self, max_bytes: int) -> GeneratedBytes:
        """:meth:`sample` at temperature 0: the most likely symbol, repeatedly."""
        return await self.sample(max_bytes, temperature=0.0)

    # ---- lifetime ----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the :class:`ByteLM` behind this state (shared by all its states)."""
        await self.byte_lm.aclose()

    def __len__(self) -> int:
        return len(self.candidates)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}(logZ={self.logZ:.4f}, bytes={_tail(self.data)})"]
        vocab = self.byte_lm.lm.vocab
        for c in self.candidates[:8]:
            share = np.exp(c.weight - self.logZ)
            last = vocab.decode(c.context[-3:], keep_special=True)
            partial = self.byte_lm.trie.prefix(c.node)
            lines.append(f"  {share:.4f}  ...{last!r} | {partial!r}")
        if len(self.candidates) > 8:
            lines.append(f"  ... {len(self.candidates) - 8} more")
        return "\n".join(lines)


def _likely_boundaries(
    beam: BeamState,
    inner: list[Candidate],
    start: int,
    above: float,
    K: int,
    ahead: bytes,
) -> list[tuple[int, ...]]:
    """Contexts the next steps' token boundaries will probably need (a guess: prefetch only).

    The next beam is the top ``K`` of the inner candidates (exact weights) and of the
    candidates this step's boundaries start at ``start`` (weights at most the boundary's).
    Ranking all of them by those numbers, the boundaries of the top ``K`` are the guess;
    then the same guess is stepped over each byte of ``ahead`` (rows not fetched yet keep
    their bound), adding the boundaries each guessed beam would need.
    """
    byte_lm = beam.byte_lm
    trie = byte_lm.trie
    root = trie.root
    # (weight or bound, log P(context), context, node, row of the context or None)
    guess = [(c.weight, c.logp, c.context, c.node, c.next.logp) for c in inner]
    guess += [(w, w, ctx, start, None) for ctx, w in beam._boundary_contexts() if w > above]
    out: dict[tuple[int, ...], None] = {}
    for step in range(len(ahead) + 1):
        guess.sort(key=lambda g: -g[0])
        del guess[K:]
        bounds = []
        for bound, logp, context, node, row in guess:
            for token in trie.tokens_at(node).tolist():
                if row is None:
                    bounds.append((bound, bound, context + (token,)))
                elif row[token] > -np.inf:
                    lp = logp + float(row[token])
                    bounds.append((lp, lp, context + (token,)))
        out.update((ctx, None) for _, _, ctx in bounds)
        if step == len(ahead):
            break
        byte = ahead[step]
        moved = []
        for bound, logp, context, node, row in guess:
            child = trie.child(node, byte)
            if child is not None:
                moved.append((bound, logp, context, child, row))
        start = trie.child(root, byte)
        if start is not None:
            cached = byte_lm.cached_logp
            moved += [(b, lp, ctx, start, cached(ctx, beam.eos_mode)) for b, lp, ctx in bounds]
        guess = moved
    return list(out)


def _checked_bytes(data: object) -> bytes:
    """``data`` as ``bytes``, or an error naming ``prefill``'s argument (see ``prefill``).

    Only ``bytes``, ``bytearray`` and a memoryview of single bytes are read as memory;
    anything else is a sequence of byte values, checked one by one (``bytes()`` of a numpy
    array copies its buffer: ``[97, 98]`` as int64 is 16 bytes, and a float is 8).
    """
    if isinstance(data, (bytes, bytearray)) or (
        isinstance(data, memoryview) and data.format in ("B", "c")
    ):
        return bytes(data)
    if isinstance(data, str):
        raise TypeError(
            f"prefill's data must be bytes, got the text {data!r}: encode it, e.g. "
            "data.encode('utf-8')"
        )
    if isinstance(data, (numbers.Number, np.bool_)):  # bytes(3) is three NUL bytes
        raise TypeError(f"prefill's data must be bytes, got {type(data).__name__} {data!r}")
    try:
        values = data.tolist() if isinstance(data, (np.ndarray, memoryview)) else list(data)
    except (TypeError, NotImplementedError) as e:  # not iterable; a 0-d array
        raise TypeError(f"prefill's data must be bytes, got {data!r}: {e}") from e
    if not isinstance(values, list):  # a 0-d array's one value
        raise TypeError(f"prefill's data must be bytes, got {type(data).__name__} {data!r}")
    for i, value in enumerate(values):
        if not is_index(value, 256):
            integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
            error = ValueError if integral else TypeError
            raise error(
                f"prefill's data must be bytes or byte values 0..255, got {value!r} at position {i}"
            )
    return bytes(values)


def _tail(data: bytes, n: int = 24) -> str:
    return repr(data[-n:]) if len(data) <= n else "..." + repr(data[-n:])


def _scatter_logsumexp(symbols: list[np.ndarray], values: list[np.ndarray], n: int) -> np.ndarray:
    """``out[s] = logsumexp(values where symbols == s)``, -inf where there are none."""
    out = np.full(n, -np.inf)
    if not symbols:
        return out
    sym = np.concatenate(symbols).astype(np.int64)
    val = np.concatenate(values).astype(np.float64)
    np.maximum.at(out, sym, val)
    finite = np.isfinite(out)
    shift = np.where(finite, out, 0.0)
    acc = np.zeros(n)
    np.add.at(acc, sym, np.exp(val - shift[sym]))
    with np.errstate(divide="ignore"):
        res = np.log(acc) + shift
    res[~finite] = -np.inf
    return res
