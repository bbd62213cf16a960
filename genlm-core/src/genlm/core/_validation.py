"""Context validation: what every request's token ids must be, checked before queueing.

The common case (a list or tuple of Python ints in range) is checked in one C pass
(``_ids.c``) where that module was built; anything it doubts, and every input where it
was not, takes the Python path, which converts numpy integers and names the problem.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

import numpy as np

from genlm.core._errors import InvalidContextError
from genlm.core._extensions import ids

#: The C pass over a context's ids, where ``_ids`` loads; else the Python checks alone.
_first_doubt = None if ids is None else ids.first_doubt

__all__ = ["validate_context"]


def is_unordered(value: object) -> bool:
    """Whether ``value`` is a set or mapping: its iteration order means nothing, so it can
    be neither a context (ids in order) nor a batch of contexts (row i for item i)."""
    return isinstance(value, (AbstractSet, Mapping))


def is_integer(value: object) -> bool:
    """Whether ``value`` is an integer (a Python or numpy one) and not a bool: the test of
    every integer option (``max_tokens``, ``max_context_length``, a mock's ``seed``)."""
    return not isinstance(value, (bool, np.bool_)) and isinstance(value, numbers.Integral)


def is_real(value: object) -> bool:
    """Whether ``value`` is a real number (a Python or numpy one) and not a bool: the type
    test of every real option (a temperature, smc's ``ess_threshold``)."""
    return not isinstance(value, (bool, np.bool_)) and isinstance(value, numbers.Real)


def checked_count(name: str, value: object, minimum: int, *, whole_floats: bool = False) -> int:
    """``value`` as an ``int``, for an option that counts something (a batch size, a byte
    budget): options are checked where they are set, so a bad one fails there, by name,
    instead of in a comparison later (a NaN batch size left every request waiting).

    ``whole_floats``: also take a float with no fractional part (a byte budget written
    ``1e9``).

    Raises:
        TypeError: ``value`` is not an integer (a bool, a string, a float unless
            ``whole_floats`` and whole).
        ValueError: it is below ``minimum``.
    """
    if (
        whole_floats
        and not is_integer(value)
        and is_real(value)
        and math.isfinite(value)
        and float(value).is_integer()
    ):
        value = int(value)
    if not is_integer(value):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def checked_seconds(name: str, value: object) -> float:
    """``value`` as a ``float``, for a duration option (finite, >= 0; see
    :func:`checked_count`).

    Raises:
        TypeError: ``value`` is not a real number (a bool, a string).
        ValueError: it is negative, infinite or NaN.
    """
    if not is_real(value):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not 0 <= value < math.inf:  # NaN too
        raise ValueError(f"{name} must be finite and >= 0, got {value}")
    return float(value)


def check_token_bytes(tokens: Sequence[object], what: str = "vocab") -> None:
    """Raise ``TypeError`` naming the first entry of ``tokens`` that is not ``bytes``: the
    check of every list of token bytes (a trie's, a mock's vocabulary, ``forbid_bytes``'),
    where a conversion would hide the mistake (``bytes(3)`` is three NUL bytes, a ``str``
    token matches no byte, a ``bytes`` object given whole iterates as ints).

    Bytes subclasses (genlm-backend's ``Token``) are bytes; a hole is ``b""``, as in
    :class:`~genlm.core.Vocabulary`.

    Args:
        tokens: the entries to check.
        what: the argument's name, for the message.
    """
    if isinstance(tokens, (bytes, bytearray, memoryview, str)):
        raise TypeError(
            f"{what} must be a list of byte strings, one per token id, got one "
            f"{type(tokens).__name__} {tokens!r:.60}"
        )
    if set(map(type, tokens)) <= {bytes}:
        return
    for i, entry in enumerate(tokens):
        if entry is None:
            raise TypeError(f"{what}[{i}] is None, not bytes (a hole is b'')")
        if not isinstance(entry, bytes):
            raise TypeError(f"{what}[{i}] is {type(entry).__name__} {entry!r:.60}, not bytes")


#: Vocabularies up to this size check ids against a set of the valid ones (one C-level
#: pass, a third of ``min`` plus ``max``; 2**18 ids cost about 16 MiB, once per size).
_ID_SET_MAX = 2**18


@functools.lru_cache(maxsize=4)
def _valid_ids(vocab_size: int) -> frozenset[int]:
    return frozenset(range(vocab_size))


def validate_context(token_ids: Sequence[int], vocab_size: int) -> tuple[int, ...]:
    """Return ``token_ids`` as a tuple of ints, or raise a clear ``InvalidContextError``.

    Accepted: any ordered iterable of integers (list, tuple, range, a 1-D numpy integer
    array, a generator). Rejected: raw text and bytes (``str``, ``bytes``, ``bytearray``,
    ``memoryview``: tokenize them first), unordered collections (``set``, ``dict``: their
    iteration order is not a context), booleans and non-integer ids. Public so that code
    taking contexts for any ``AsyncLM`` (genlm-bytes) checks them the same way.

    Args:
        token_ids: the context to check.
        vocab_size: ids must lie in ``[0, vocab_size)``.

    Returns:
        The ids as a tuple of Python ints.

    Raises:
        InvalidContextError: the context is empty, not an ordered sequence of integers, or
            holds an id outside the vocabulary.
    """
    if type(token_ids) not in (list, tuple):  # the common case skips the slower checks
        if isinstance(token_ids, (str, bytes, bytearray, memoryview)):
            raise InvalidContextError(
                f"expected a sequence of token ids, got {type(token_ids).__name__}; "
                "tokenize text first (e.g. lm.tokenizer.encode(text))"
            )
        if is_unordered(token_ids):
            raise InvalidContextError(
                f"expected an ordered sequence of token ids, got a {type(token_ids).__name__}, "
                "whose order is not a context; pass a list or tuple"
            )
    try:
        ids = tuple(token_ids)
    except TypeError:
        raise InvalidContextError(
            f"expected a sequence of token ids, got {type(token_ids).__name__}"
        ) from None
    if not ids:
        raise InvalidContextError(
            "empty context: a next-token distribution needs at least one token "
            "(start from the BOS token, lm.vocab.bos_token_id, if the model has one)"
        )
    if _first_doubt is not None and _first_doubt(ids, vocab_size) < 0:
        return ids  # the common case, checked in C; any doubt takes the path below
    if list(map(type, ids)).count(int) != len(ids):  # C-level passes; the rare rest below
        converted = []
        for pos, t in enumerate(ids):
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
                raise InvalidContextError(
                    f"token id at position {pos} is {t!r} ({type(t).__name__}); "
                    "token ids must be integers"
                )
            converted.append(int(t))
        ids = tuple(converted)
    if vocab_size <= _ID_SET_MAX and _valid_ids(vocab_size).issuperset(ids):
        return ids
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise InvalidContextError(
            f"token id {bad} at position {ids.index(bad)} is out of range "
            f"for a vocabulary of {vocab_size} tokens"
        )
    return ids
