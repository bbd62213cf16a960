"""``LazyTrieState`` and ``TrieMode``: one beam candidate seen through the published
genlm-bytes 0.2 API (``genlm.bytes.byte_lm.trie_state``; ``TrieMode`` is defined in
``genlm.bytes.trie``, as in 0.2).

A view of a :class:`Candidate` (token context, partial token = trie node, weight) and its
model; it computes nothing of its own beyond reading the candidate's masses.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from genlm.bytes._dist import EOS_INDEX, EOT_INDEX, SYMBOLS, LazyByteProbs, is_index, logsumexp
from genlm.bytes._model import ByteModel
from genlm.bytes._types import Candidate
from genlm.bytes.byte_lm.lm_state import StatefulTokenizedLM
from genlm.bytes.trie import AsyncEosModeTrie, EosModeTrie, TrieMode


@attrs.define(eq=False, repr=False, slots=False)
class LazyTrieState:
    """A candidate of the beam: the token context, the partial token's trie node, and its
    log weight (``log P(context) + log mass[node]``).

    Args:
        byte_lm: the model the candidate belongs to.
        candidate: the candidate.
        eos_mode: whether EOS tokens that are text end the sequence (``TrieMode.WITH_EOS``).
        data: the bytes consumed since the prompt (its beam's; ``<<`` adds to them), so a
            ``ByteBeamState`` made of candidates reports the bytes it is after.

    A candidate at a token boundary holds no masses until :meth:`materialize` fetches them;
    what reads them before raises ``ValueError`` ("State is not yet materialized.", 0.2's
    wording). :meth:`with_mode` takes a :class:`TrieMode` or its value.
    """

    byte_lm: ByteModel
    candidate: Candidate
    eos_mode: bool = True
    data: bytes = b""

    @classmethod
    def initial(
        cls, lm: Any, trie: AsyncEosModeTrie | EosModeTrie, mode: TrieMode = TrieMode.WITH_EOS
    ) -> LazyTrieState:
        """The state right after ``lm``'s BOS token: at the trie root, weight 0, not yet
        materialized (``await state.materialize()`` fetches the row), as 0.2's.

        Args:
            lm: the token model, a genlm-core ``AsyncLM`` (``genlm.backend``'s models are
                ones) whose vocabulary has a BOS token.
            trie: a ``genlm.bytes.trie.AsyncTokenByteTrie`` or ``TokenByteTrie`` of
                ``lm``'s tokens, as 0.2 programs make it
                (``AsyncTokenByteTrie.from_vocab(lm.byte_vocab, eos_tokens=[...])``): its
                EOS strings end the sequence. It is only read: the masses are computed on
                the trie of ``lm``'s vocabulary (the same tokens, special ones atomic).
            mode: a :class:`TrieMode` or its value.

        Each call makes a byte model of its own (its own mass cache) with
        :class:`genlm.bytes.ByteLM`'s default beam options, so the states that come from
        one call belong together, and ``ByteBeamState(states, params)`` takes those
        options: ``BeamParams(K=16, heal_max_splits=8, eos_tokens=<the trie's>)``. To
        choose a beam's options, start it with ``ByteBeamState.initial(lm, params)``.

        Raises:
            TypeError: ``lm`` is not a token model, or ``trie`` is not one of those tries
                (genlm-core's ``TokenByteTrie`` has no EOS strings: wrap its vocabulary).
            ValueError: ``trie`` spells some text token of ``lm`` otherwise (another
                model's), an EOS string of it is no token of ``lm``, ``lm`` has no BOS
                token, or ``mode`` is not a mode.
        """
        eos_mode = TrieMode(mode) is TrieMode.WITH_EOS
        published = _published_trie(trie)
        model = ByteModel(lm, eos=sorted(published.eos_tokens))
        _check_same_tokens(published, model.lm.vocab)
        root = model.trie.root
        candidate = Candidate((bos_token(lm),), 0.0, root, None, 0.0)
        return cls(model, candidate, eos_mode)

    @property
    def node(self) -> int:
        """The partial token's node in ``byte_lm.trie`` (the root: at a token boundary)."""
        return self.candidate.node

    @property
    def weight(self) -> float:
        """Log weight: the probability of every token sequence this candidate stands for."""
        return self.candidate.weight

    @property
    def mode(self) -> TrieMode:
        """How EOS tokens that are text count here: ``WITH_EOS`` (they end the sequence) or
        ``WITHOUT_EOS`` (they count as text, as while prefilling)."""
        return TrieMode.of(self.eos_mode)

    @property
    def terminated(self) -> bool:
        """Always False: EOS is a next-symbol outcome here, never a state."""
        return False

    @property
    def lm_state(self) -> StatefulTokenizedLM:
        """The token context with the token model."""
        return StatefulTokenizedLM(self.byte_lm.lm, self.candidate.context)

    @property
    def partial(self) -> bytes:
        """The partial token's bytes."""
        return self.byte_lm.trie.prefix(self.node)

    @property
    def mass(self) -> np.ndarray:
        """Log mass of every trie node after the context (float64), read-only: the model's
        mass cache shares it with every state of the same context (copy it to modify)."""
        if self.candidate.next is None:
            raise ValueError("State is not yet materialized.")
        return np.asarray(self.candidate.next.mass)  # a device vector crosses here, whole

    def actions(self) -> dict[int, int]:
        """``byte -> child node`` for each byte that continues the partial token."""
        trie = self.byte_lm.trie
        lo, hi = int(trie.child_start[self.node]), int(trie.child_stop[self.node])
        return {int(e): lo + i for i, e in enumerate(trie.edge[lo:hi].tolist()) if e < 256}

    @property
    def logp_next(self) -> LazyByteProbs:
        """This candidate's next-symbol log-probabilities, as 0.2's ``LazyByteProbs``: its
        ``ps`` has shape (258,), bytes, then :data:`EOT_INDEX` (the partial token is a whole
        token), then :data:`EOS_INDEX` (at a boundary). Normalized over these outcomes;
        -inf where impossible."""
        nxt = self.candidate.next
        if nxt is None:
            raise ValueError("State is not yet materialized.")
        out = np.full(SYMBOLS, -np.inf)
        for byte, child in self.actions().items():
            out[byte] = nxt.mass[child]
        if self.node == self.byte_lm.trie.root:
            out[EOS_INDEX] = nxt.log_eos
        else:
            ids = self.byte_lm.trie.tokens_at(self.node)
            if len(ids):
                out[EOT_INDEX] = logsumexp(nxt.logp[ids])
        total = logsumexp(out)
        return LazyByteProbs(out - total if np.isfinite(total) else out)

    def get_EOT(self) -> int | None:
        """The id of the token whose bytes are exactly the partial token, or None if the
        partial token is not a whole token (at the root too: no token is empty).

        ``state.get_EOT() is not None`` means what it means in genlm-bytes 0.2: "the
        partial token is a whole token", in either mode (a text EOS token is one, even in
        ``WITH_EOS`` mode, where it cannot end as text: :meth:`extend` is None there). 0.2
        returned the trie's end-of-token node; this trie has no such nodes (a token ends at
        the node of its last byte), so the token id stands in: index the model's rows with
        it, not :attr:`mass` (which is by node). Where several ids spell these bytes, the
        lowest. Needs no masses.
        """
        ids = self.byte_lm.trie.tokens_at(self.node)
        return int(ids[0]) if len(ids) else None

    def extend(self) -> LazyTrieState | None:
        """The state after ending the partial token as a token: that token appended to the
        context, at the trie root, weight ``log P(context) + log P(token | context)``, not
        yet materialized; None if the partial token is not a whole token
        (:meth:`get_EOT`) or cannot end as text here (probability zero, such as a text EOS
        token in ``WITH_EOS`` mode).

        Where several ids spell the partial bytes, the weight holds them all (the
        end-of-token outcome of :attr:`logp_next`, and the total weight of the states
        ``ByteBeamState.extend`` makes of this candidate, one per id: a beam's mass is
        kept), and the most probable id (the lowest of equals) is the one appended, so
        what follows is predicted after it alone. ``ByteBeamState.extend`` keeps the ids
        apart (exact).

        Needs the masses only where a token ends, as 0.2's: a state at the root (where
        unmaterialized states are) gives None.

        Raises:
            ValueError: a whole partial token without masses (a state made by hand).
        """
        ids, logps = self._whole_tokens()
        weight = self.candidate.logp + logsumexp(logps)
        if weight == -np.inf:
            return None
        return self._after(int(ids[int(np.argmax(logps))]), weight)

    def extend_all(self) -> list[LazyTrieState]:
        """:meth:`extend` with the ids that spell the partial bytes kept apart, as released
        genlm-bytes 0.2.0 names it: one state per id of nonzero probability (lowest id
        first), each after its own token, weight ``log P(context) + log P(id | context)``,
        not yet materialized; empty where :meth:`extend` is None. Together they weigh what
        :meth:`extend`'s one state weighs (exact where several ids share the bytes).

        Raises:
            ValueError: as :meth:`extend`.
        """
        ids, logps = self._whole_tokens()
        return [
            self._after(int(token), self.candidate.logp + float(logp))
            for token, logp in zip(ids, logps)
            if logp > -np.inf
        ]

    def _whole_tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """The ids whose bytes are the partial token, and their float64 log-probabilities
        after the context (both empty if none is).

        Raises:
            ValueError: ids without masses (a state made by hand).
        """
        c = self.candidate
        ids = self.byte_lm.trie.tokens_at(c.node)
        if not len(ids):
            return ids, np.empty(0)
        if c.next is None:
            raise ValueError("State is not yet materialized.")
        return ids, np.asarray(c.next.logp[ids], dtype=np.float64)  # device rows: these only

    def _after(self, token: int, weight: float) -> LazyTrieState:
        """The unmaterialized state at the root after ``token``, of log weight ``weight``."""
        c = self.candidate
        root = self.byte_lm.trie.root
        return attrs.evolve(
            self, candidate=Candidate((*c.context, token), weight, root, None, weight)
        )

    def __lshift__(self, byte: int) -> LazyTrieState | None:
        """The candidate after ``byte`` inside its partial token, or None if none continues.

        Raises:
            ValueError: ``byte`` is not a byte value 0..255, the end of token (256) and EOS
                (257) of :attr:`logp_next` included, with what to do instead (0.2.0 moved
                to a terminated state by EOS; here EOS is an outcome, never a state).
        """
        if not is_index(byte, 256):
            raise ValueError(_not_a_byte(byte))
        c = self.candidate
        if c.next is None:
            raise ValueError("State is not yet materialized.")
        child = self.byte_lm.trie.child(c.node, byte)
        if child is None:
            return None
        weight = c.logp + float(c.next.mass[child])
        if weight == -np.inf:
            return None
        return attrs.evolve(
            self,
            candidate=Candidate(c.context, c.logp, child, c.next, weight),
            data=self.data + bytes([byte]),
        )

    def with_mode(self, mode: TrieMode) -> LazyTrieState:
        """The same candidate with EOS counted as ``mode`` says: masses recomputed from its
        LM row (no LM call; unfetched ones stay unfetched), weight updated."""
        eos_mode = TrieMode(mode) is TrieMode.WITH_EOS
        c = self.candidate
        if eos_mode == self.eos_mode or c.next is None:
            return attrs.evolve(self, eos_mode=eos_mode)
        nxt = self.byte_lm.in_mode(c.context, c.next, eos_mode)
        weight = c.logp if c.node == self.byte_lm.trie.root else c.logp + float(nxt.mass[c.node])
        return attrs.evolve(
            self, candidate=attrs.evolve(c, next=nxt, weight=weight), eos_mode=eos_mode
        )

    async def materialize(self) -> LazyTrieState:
        """This state with its context's masses fetched (one LM call unless cached)."""
        c = self.candidate
        if c.next is not None:
            return self
        (nxt,) = await self.byte_lm.next_tokens([c.context], self.eos_mode)
        return attrs.evolve(self, candidate=attrs.evolve(c, next=nxt))

    async def cleanup(self) -> None:
        """Release the model's caches (shared by every state of the model), as genlm-bytes
        0.2's releases its trie's task: every state stays usable, the caches fill again on
        use (``ByteBeamState.cleanup`` does the same; close the model with ``aclose``)."""
        self.byte_lm.clear_cache()

    def __repr__(self) -> str:
        return f"{self.weight:.2f}: {self.lm_state!r}|{self.partial!r}"


def _not_a_byte(symbol: object) -> str:
    """Why ``state << symbol`` takes no ``symbol`` (not a byte value), and what to do."""
    if is_index(symbol, SYMBOLS) and symbol == EOS_INDEX:
        return (
            f"{EOS_INDEX} is EOS, an outcome of logp_next (logp_next[{EOS_INDEX}]: the "
            "probability that the sequence ends here), not a byte to advance by: a state "
            "never consumes EOS here (terminated is always False); to end the sequence, "
            "stop advancing and read that probability"
        )
    if is_index(symbol, SYMBOLS) and symbol == EOT_INDEX:
        return (
            f"{EOT_INDEX} is the end of token of logp_next (logp_next[{EOT_INDEX}]), not a "
            "byte to advance by; end the partial token with extend()"
        )
    return f"expected a byte value 0..255, got {symbol!r}"


def bos_token(lm: Any) -> int:
    """The BOS token id of ``lm``, after which the published API's states start.

    Raises:
        ValueError: the vocabulary has no BOS token.
    """
    bos = lm.vocab.bos_token_id
    if bos is None:
        raise ValueError("the vocabulary has no BOS token; use ByteLM(lm).initial(ids)")
    return bos


def _published_trie(trie: Any) -> EosModeTrie:
    """The :class:`EosModeTrie` that ``trie`` is or wraps (the 0.2 layer's tries).

    Raises:
        TypeError: ``trie`` is neither.
    """
    inner = trie.trie if isinstance(trie, AsyncEosModeTrie) else trie
    if not isinstance(inner, EosModeTrie):
        raise TypeError(
            "trie must be a genlm.bytes.trie.AsyncTokenByteTrie or TokenByteTrie of the "
            "model's tokens, e.g. AsyncTokenByteTrie.from_vocab(lm.byte_vocab, "
            f"eos_tokens=[...]); got {type(trie).__module__}.{type(trie).__qualname__}"
        )
    return inner


def _check_same_tokens(trie: EosModeTrie, vocab: Any) -> None:
    """Refuse a trie that spells some text token of ``vocab`` (a genlm-core
    ``Vocabulary``) otherwise: its states would mean another model's bytes. Special and
    unused ids are not compared (they spell no bytes here; 0.2's tries may hold their text,
    and a model's padding ids are in no tokenizer's list)."""
    not_text = set(vocab.special_ids) | set(vocab.unused_ids)
    decode = trie.decode
    for i, token in enumerate(vocab.tokens):
        if i not in not_text and (i >= len(decode) or decode[i] != token):
            theirs = repr(decode[i]) if i < len(decode) else "missing"
            raise ValueError(
                f"the trie is not of this model's tokens: token {i} is {token!r}, in the "
                f"trie {theirs}; build it from the model (from_vocab(lm.byte_vocab, ...))"
            )
