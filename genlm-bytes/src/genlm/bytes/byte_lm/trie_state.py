"""``LazyTrieState`` and ``TrieMode``: one beam candidate seen through the published
genlm-bytes 0.2 API (``genlm.bytes.byte_lm.trie_state``).

A view of a :class:`Candidate` (token context, partial token = trie node, weight) and its
model; it computes nothing of its own beyond reading the candidate's masses.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import attrs
import numpy as np

from genlm.bytes._dist import LazyByteProbs, logsumexp
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
        """``WITH_EOS`` if ``eos_mode``, else ``WITHOUT_EOS``."""
        return cls.WITH_EOS if eos_mode else cls.WITHOUT_EOS


#: Indices of the published API's next-symbol arrays: 256 bytes, then end of token
#: (a token boundary here), then end of sequence.
EOT_INDEX = 256
EOS_INDEX = 257
SYMBOLS = 258


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

    def __lshift__(self, byte: int) -> LazyTrieState | None:
        """The candidate after ``byte`` inside its partial token, or None if none continues."""
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
