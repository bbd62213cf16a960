"""Adaptive token healing: keep the bytes reachable when the pruned beam cannot.

A pruned beam can hold only candidates whose partial tokens do not continue with the
next byte (say the partial ``b"ca"`` of ``b"cat"`` when the next byte is ``b"r"``).
The bytes are still reachable by other tokenizations: commit a shorter token for the
front of the partial (``b"c"``) and re-spell the moved bytes plus the new byte
(``b"ar"``) from a token boundary, committing more tokens inside them if needed. The
healed candidate's weight is the true probability mass of that tokenization path, so
the beam stays a lower bound.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from genlm.bytes._types import Candidate

if TYPE_CHECKING:
    from genlm.bytes._model import ByteModel

logger = logging.getLogger(__name__)


async def heal(
    byte_lm: ByteModel, candidates: Sequence[Candidate], eos_mode: bool, byte: int
) -> list[Candidate]:
    """One candidate that reaches ``byte`` by re-splitting a partial token, or ``[]``.

    ``candidates``: the (pruned) beam, heaviest first; ``eos_mode`` as the beam's. They
    are tried in order; for each, the fewest moved bytes first (at most
    ``heal_max_backoff``), then the longest tokens first inside the moved bytes (at most
    ``heal_max_splits`` more commits).
    """
    trie = byte_lm.trie
    max_backoff = byte_lm.heal_max_backoff
    for c in candidates:
        if c.node == trie.root:
            continue
        partial = trie.prefix(c.node)
        most = len(partial) if max_backoff is None else min(max_backoff, len(partial))
        for moved in range(1, most + 1):
            keep = len(partial) - moved
            rest = partial[keep:] + bytes([byte])
            if keep == 0:
                starts = [(c.context, c.logp)]
            else:
                node = trie.node_of(partial[:keep])
                starts = [
                    (c.context + (t,), c.logp + float(c.next.logp[t]))
                    for t in trie.tokens_at(node).tolist()
                ]
            for context, logp in starts:
                if logp == -np.inf:
                    continue
                healed = await _spell(
                    byte_lm, eos_mode, context, logp, rest, byte_lm.heal_max_splits
                )
                if healed is not None:
                    logger.info(
                        "token healing: re-split %r + %r after moving %d bytes",
                        partial,
                        bytes([byte]),
                        moved,
                    )
                    return [healed]
    return []


async def _spell(
    byte_lm: ByteModel,
    eos_mode: bool,
    context: tuple[int, ...],
    logp: float,
    data: bytes,
    splits: int | None,
) -> Candidate | None:
    """A candidate spelling ``data`` from a boundary after ``context``, or None.

    ``data`` ends inside the final (partial) token; up to ``splits`` whole tokens may be
    committed before it, longest first.
    """
    trie = byte_lm.trie
    (nxt,) = await byte_lm.next_tokens([context], eos_mode)
    path = [trie.root]
    for b in data:
        node = trie.child(path[-1], b)
        if node is None:
            break
        path.append(node)
    if len(path) == len(data) + 1:
        weight = logp + float(nxt.mass[path[-1]])
        if weight > -np.inf:
            return Candidate(context, logp, path[-1], nxt, weight)
    if splits == 0:
        return None
    for depth in range(min(len(path) - 1, len(data) - 1), 0, -1):
        for token in trie.tokens_at(path[depth]).tolist():
            token_logp = float(nxt.logp[token])
            if token_logp == -np.inf:
                continue
            found = await _spell(
                byte_lm,
                eos_mode,
                context + (token,),
                logp + token_logp,
                data[depth:],
                None if splits is None else splits - 1,
            )
            if found is not None:
                return found
    return None
