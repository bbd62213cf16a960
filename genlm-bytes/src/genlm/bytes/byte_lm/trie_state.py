"""``LazyTrieState`` and ``TrieMode``: one beam candidate seen through the published
genlm-bytes 0.2 API (``genlm.bytes.byte_lm.trie_state``).

A view of a :class:`Candidate` (token context, partial token = trie node, weight) and its
model; it computes nothing of its own beyond reading the candidate's masses.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import numpy as np

from genlm.bytes._dist import logsumexp
from genlm.bytes._types import Candidate
from genlm.bytes.byte_lm.lm_state import StatefulTokenizedLM

if TYPE_CHECKING:
    from genlm.bytes._model import ByteModel


class TrieMode(enum.Enum):
    """How EOS tokens that are ordinary text count (the published API's trie modes).

    ``WITH_EOS``: they end the sequence (a state's EOS mode). ``WITHOUT_EOS``: they count
    as the text they spell, as while prefilling.
    """

    WITH_EOS = "with_eos"
    WITHOUT_EOS = "without_eos"

    @classmethod
    def of(cls, eos_mode: bool) -> TrieMode:
        """The mode of a state whose ``eos_mode`` is given.

        Args:
            eos_mode: whether EOS tokens that are text end the sequence.

        Returns:
            ``WITH_EOS`` if ``eos_mode``, else ``WITHOUT_EOS``.
        """
        return cls.WITH_EOS if eos_mode else cls.WITHOUT_EOS


#: Indices of the published API's next-symbol arrays: 256 bytes, then end of token
#: (a token boundary here), then end of sequence.
EOT_INDEX = 256
EOS_INDEX = 257
SYMBOLS = 258


class LazyTrieState:
    """A candidate of the beam: the token context, the partial token's trie node, and its
    log weight (``log P(context) + log mass[node]``).

    Args:
        byte_lm: the model the candidate belongs to.
        candidate: the candidate.
        eos_mode: whether EOS tokens that are text end the sequence (``TrieMode.WITH_EOS``).
    """

    def __init__(self, byte_lm: ByteModel, candidate: Candidate, eos_mode: bool = True):
        self.byte_lm = byte_lm
        self.candidate = candidate
        self.eos_mode = eos_mode

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
        """Log mass of every trie node after the context (float64).

        Raises:
            ValueError: a candidate at a token boundary whose masses were not fetched yet
                (see :meth:`materialize`).
        """
        if self.candidate.next is None:
            raise ValueError("State is not yet materialized.")
        return np.asarray(self.candidate.next.mass)  # a device vector crosses here, whole

    def actions(self) -> dict[int, int]:
        """Where each next byte leads inside the partial token.

        Returns:
            ``byte -> child node`` for each byte that continues the partial token's node
            in the trie (the EOS child excluded).
        """
        trie = self.byte_lm.trie
        lo, hi = int(trie.child_start[self.node]), int(trie.child_stop[self.node])
        return {int(e): lo + i for i, e in enumerate(trie.edge[lo:hi].tolist()) if e < 256}

    @property
    def logp_next(self) -> np.ndarray:
        """This candidate's next-symbol log-probabilities, shape (258,): bytes, then
        :data:`EOT_INDEX` (the partial token is a whole token), then :data:`EOS_INDEX`
        (at a boundary). Normalized over these outcomes; -inf where impossible.

        Raises:
            ValueError: a candidate at a token boundary whose masses were not fetched yet
                (see :meth:`materialize`).
        """
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
        return out - total if np.isfinite(total) else out

    def __lshift__(self, byte: int) -> LazyTrieState | None:
        """The candidate after ``byte`` inside its partial token, or None if none continues.

        Raises:
            ValueError: the masses were not fetched yet (see :meth:`materialize`).
        """
        c = self.candidate
        if c.next is None:
            raise ValueError("State is not yet materialized.")
        child = self.byte_lm.trie.child(c.node, byte)
        if child is None:
            return None
        weight = c.logp + float(c.next.mass[child])
        if weight == -np.inf:
            return None
        return LazyTrieState(
            self.byte_lm, Candidate(c.context, c.logp, child, c.next, weight), self.eos_mode
        )

    def with_mode(self, mode: TrieMode) -> LazyTrieState:
        """The same candidate with EOS counted as ``mode`` says (no LM call).

        Args:
            mode: a :class:`TrieMode` or its value (``"with_eos"``, ``"without_eos"``).

        Returns:
            A new state: its masses recomputed from the candidate's LM row (kept unfetched
            if they were), its weight updated.

        Raises:
            ValueError: ``mode`` is not a :class:`TrieMode` value.
            ByteLMClosedError: the model was closed (when masses must be recomputed).
        """
        eos_mode = TrieMode(mode) is TrieMode.WITH_EOS
        c = self.candidate
        if eos_mode == self.eos_mode or c.next is None:
            return LazyTrieState(self.byte_lm, c, eos_mode)
        nxt = self.byte_lm.in_mode(c.context, c.next, eos_mode)
        weight = c.logp if c.node == self.byte_lm.trie.root else c.logp + float(nxt.mass[c.node])
        return LazyTrieState(
            self.byte_lm, Candidate(c.context, c.logp, c.node, nxt, weight), eos_mode
        )

    async def materialize(self) -> LazyTrieState:
        """This state with its context's masses fetched (one LM call unless cached).

        Returns:
            This state if its masses are there already, else a new one holding them.

        Raises:
            ByteLMClosedError: the model was closed.
        """
        c = self.candidate
        if c.next is not None:
            return self
        (nxt,) = await self.byte_lm.next_tokens([c.context], self.eos_mode)
        return LazyTrieState(
            self.byte_lm, Candidate(c.context, c.logp, c.node, nxt, c.weight), self.eos_mode
        )

    async def cleanup(self) -> None:
        """Release the model's caches (shared by every state of the model)."""
        await self.byte_lm.aclose()

    def __repr__(self) -> str:
        return f"{self.weight:.2f}: {self.lm_state!r}|{self.partial!r}"
