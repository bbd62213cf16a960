"""The genlm-bytes 0.2 option names: ``BeamParams`` and ``TrieMode``, mapped onto ``ByteLM``'s.

Programs written for the published genlm-bytes API (genlm-control's ``ByteLLM``) build a
``BeamParams`` and pass it to ``ByteBeamState.initial``; this module turns it into the
keyword options of :class:`genlm.bytes.ByteLM`, the one implementation underneath.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import attrs
import numpy as np


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


def _eos_set(value: Iterable[bytes] | None) -> set[bytes] | None:
    if value is None:
        return None
    if isinstance(value, (bytes, str)):
        raise TypeError("EOS strings must be a list of byte strings (e.g. [b'\\n\\n']), not one")
    out = set()
    for item in value:
        if not isinstance(item, (bytes, bytearray)):
            raise TypeError(f"an EOS string must be bytes, got {item!r}")
        out.add(bytes(item))
    return out


@attrs.define(kw_only=False)
class BeamParams:
    """Options of the byte-level beam, by the published genlm-bytes 0.2 names.

    Args:
        K: beam width, candidates kept before each step (None: no limit, exact).
        prune_threshold: also drop candidates whose share of the beam's mass is at most
            this; in [0, 1).
        verbose: log each new beam (logger ``genlm.bytes._beam``, level INFO).
        eos_tokens: byte strings whose tokens end the sequence (``b"<|endoftext|>"``,
            ``b"\\n\\n"``). None or empty: no token ends it (no EOS mass), as documented.
        heal: adaptive token healing when no candidate can take the next byte.
        heal_max_backoff: most bytes moved out of a partial token when healing (None: all).
        heal_max_splits: most extra tokens committed inside the moved bytes (None: no limit).
        eos_byte_strings: the same as ``eos_tokens`` (genlm-bytes 0.2.0's released name, used
            by genlm-control 0.4.1); give one of the two, or both equal.

    Raises:
        ValueError: ``K < 1``, a threshold outside [0, 1), a negative healing limit, or
            ``eos_tokens`` and ``eos_byte_strings`` that differ.
        TypeError: an EOS string that is not bytes, or one string instead of a list.
    """

    K: int | None
    prune_threshold: float = 0.0
    verbose: bool = False
    eos_tokens: set[bytes] | None = attrs.field(default=None, converter=_eos_set)
    heal: bool = True
    heal_max_backoff: int | None = None
    heal_max_splits: int | None = None
    eos_byte_strings: set[bytes] | None = attrs.field(default=None, converter=_eos_set)

    def __attrs_post_init__(self) -> None:
        if self.K is not None and (isinstance(self.K, bool) or self.K < 1):
            raise ValueError(f"K must be a positive beam width or None, got {self.K!r}")
        if not 0.0 <= self.prune_threshold < 1.0:
            raise ValueError(f"prune_threshold must be in [0, 1), got {self.prune_threshold}")
        for name in ("heal_max_backoff", "heal_max_splits"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value}")
        a, b = self.eos_tokens, self.eos_byte_strings
        if a is not None and b is not None and a != b:
            raise ValueError(
                "eos_tokens and eos_byte_strings name the same option and differ: "
                f"{sorted(a)} vs {sorted(b)}; give one"
            )
        merged = a if a is not None else b
        self.eos_tokens = self.eos_byte_strings = merged if merged is not None else set()

    @property
    def log_prune_threshold(self) -> float:
        """``log(prune_threshold)``, -inf for 0."""
        return float(np.log(self.prune_threshold)) if self.prune_threshold else -np.inf

    def byte_lm_options(self) -> dict[str, Any]:
        """The keyword options of :class:`genlm.bytes.ByteLM` these parameters mean.

        Returns:
            ``K``, ``prune_threshold``, ``eos`` (the EOS strings, sorted), ``heal``,
            ``heal_max_backoff``, ``heal_max_splits`` and ``verbose``, by ``ByteLM``'s
            names, and ``prune_on_step=False``: genlm-bytes 0.2's beam prunes only when
            asked.
        """
        return {
            "K": self.K,
            "prune_threshold": self.prune_threshold,
            "eos": sorted(self.eos_tokens or ()),
            "heal": self.heal,
            "heal_max_backoff": self.heal_max_backoff,
            "heal_max_splits": self.heal_max_splits,
            "verbose": self.verbose,
            "prune_on_step": False,
        }
