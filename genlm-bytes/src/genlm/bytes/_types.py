"""Data types shared by the byte-level modules (a leaf module: it imports none of them).

:class:`NextTokens` is what the model (``_bytelm``) computes and caches, and what the beam
(``_beam``) and healing (``_heal``) read; :class:`Candidate` is what the beam holds and
healing makes. Keeping them here lets each of those modules import them without an
import circle.
"""

from __future__ import annotations

from collections.abc import Hashable

import attrs
import numpy as np


@attrs.frozen(slots=True, eq=False)
class NextTokens:
    """What one token context predicts, in the trie's terms.

    Built only by :meth:`ByteLM.next_tokens`, the one place that decides which token ids
    are EOS (and so never spell bytes) in each mode: every consumer commits tokens with
    :attr:`logp`, never with the LM's raw row, so a text EOS token (``b"\\n\\n"``) cannot
    count both as EOS and as the bytes it spells.

    Attributes:
        lm_row: the LM's next-token log-probabilities as it gave them (float32 or float64),
            read-only: a copy unless the LM's row was read-only and held only its own
            memory (``_model.kept_row``); kept only so the other EOS mode can reuse the row
            without an LM call.
        logp: log-probability of committing each token id as text (float64): ``lm_row``
            with the ids that are EOS in this mode at -inf.
        mass: ``mass[v]`` is the log of the total probability of the text tokens below trie
            node ``v`` (float64, exact in log space), from :attr:`logp`.
        log_eos: log-probability that the next token is an EOS token (-inf while
            prefilling, where EOS tokens spelled by bytes count as text).
        variant: the token LM's variant the row was computed under (its
            ``current_variant`` then, e.g. a LoRA adapter's name; None for an LM without
            variants).

    With device rows (``ByteLM(device_rows=True)``) ``lm_row`` is a clone of the LM's torch
    tensor and ``logp`` and ``mass`` are ``genlm.bytes._device.DeviceVector`` objects on its
    device: indexed like these arrays, each read copies only the indexed entries to the host.
    """

    lm_row: np.ndarray
    logp: np.ndarray
    mass: np.ndarray
    log_eos: float
    variant: Hashable = None


@attrs.frozen(slots=True, eq=False)
class Candidate:
    """One tokenization hypothesis of the bytes consumed so far.

    Attributes:
        context: prompt token ids plus the committed tokens.
        logp: log-probability of the committed tokens given the prompt.
        node: trie node of the partial token (the root: at a token boundary).
        next: the context's next-token masses (None until fetched; root only).
        weight: ``logp + next.mass[node]``, or ``logp`` at the root.
    """

    context: tuple[int, ...]
    logp: float
    node: int
    next: NextTokens | None
    weight: float
