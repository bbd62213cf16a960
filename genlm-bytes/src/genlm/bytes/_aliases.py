"""Options that genlm-bytes 0.2's documentation and its released package name differently.

The documented pages say ``eos_tokens``, ``atomic_tokens``, ``eot_token``; genlm-bytes 0.2.0
(and genlm-control 0.4.1, which calls it) says ``eos_byte_strings``,
``atomic_byte_strings``, ``eot_sentinel``. The 0.2 layer (``BeamParams``,
``genlm.bytes.trie``) takes both spellings of each and merges them here, so both agree on
what "given twice" means.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def byte_string_set(name: str, value: Iterable[bytes] | None) -> set[bytes] | None:
    """``value``, a list of byte strings, as a set (None stays None: not given).

    Raises:
        TypeError: ``value`` is one string instead of a list, or holds something that is
            not bytes (a ``str`` token would never match the vocabulary's bytes).
    """
    if value is None:
        return None
    if isinstance(value, (bytes, str)):
        raise TypeError(f"{name} must be a list of byte strings (e.g. [b'\\n\\n']), not one")
    out = set()
    for item in value:
        if not isinstance(item, (bytes, bytearray)):
            raise TypeError(f"{name} must hold byte strings, got {item!r}")
        out.add(bytes(item))
    return out


def either_name(
    documented: str, value: T | None, released: str, released_value: T | None
) -> T | None:
    """The value of an option given by its documented name or its released one (None: not
    given by that name): whichever was given.

    Raises:
        ValueError: both names were given, with different values.
    """
    if value is not None and released_value is not None and value != released_value:
        raise ValueError(
            f"{documented} and {released} name the same option and differ: "
            f"{_shown(value)} vs {_shown(released_value)}; give one"
        )
    return value if value is not None else released_value


def either_byte_strings(
    documented: str,
    value: Iterable[bytes] | None,
    released: str,
    released_value: Iterable[bytes] | None,
) -> set[bytes] | None:
    """:func:`either_name` of a list-of-byte-strings option, each name's value checked and
    made a set by :func:`byte_string_set` (so the order given does not matter)."""
    return either_name(
        documented,
        byte_string_set(documented, value),
        released,
        byte_string_set(released, released_value),
    )


def _shown(value: object) -> object:
    """A set in a stable order (its own order depends on string hashing), else the value."""
    return sorted(value) if isinstance(value, (set, frozenset)) else value
