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
    if byte not in byte_lm.text_bytes(eos_mode):
        return []  # no token that spells text in this mode holds the byte
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
            if not _can_spell(byte_lm, eos_mode, rest, byte_lm.heal_max_splits):
                continue  # decided by the trie alone, before asking the LM anything
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


def _can_spell(byte_lm: ByteModel, eos_mode: bool, data: bytes, splits: int | None) -> bool:
    """Whether :func:`_spell` could spell ``data`` by the trie alone: at most ``splits``
    whole tokens that spell text in ``eos_mode``, then a partial token holding the rest.

    A necessary condition (the LM may still give a path no mass), checked before the LM is
    asked: without it healing asked the LM for every re-split of a long partial token
    before it learned that none spells the bytes (thousands of contexts for a run of
    spaces followed by a byte only an EOS token spells).
    """
    trie = byte_lm.trie
    masked = byte_lm.masked_ids(eos_mode)
    fewest = {0: 0}  # position in data -> fewest whole tokens that end there
    for start in range(len(data)):
        if start not in fewest:
            continue
        node = trie.root
        for depth, b in enumerate(data[start:], 1):
            node = trie.child(node, b)
            if node is None:
                break
            if start + depth == len(data):
                if splits is None or fewest[start] <= splits:
                    return True
                break
            tokens = trie.tokens_at(node)
            if len(tokens) and not np.isin(tokens, masked).all():
                end, used = start + depth, fewest[start] + 1
                fewest[end] = min(fewest.get(end, used), used)
    return False
