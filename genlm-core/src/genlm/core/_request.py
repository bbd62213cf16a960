"""``Request``: what one call asks for, ``(variant, ids)``, with its hash computed once.

A request is the key of the output cache and of the scheduler's dedup map: it is hashed
when looked up in the cache, when queued, when its batch is delivered and when its row is
stored, five times in all. A tuple hashes every id each time (CPython caches no tuple
hash): about 2.7 k instructions for 65 ids, 12 k for 300, which made hashing a fifth of a
request's cost at 65 ids and most of it for long contexts. A ``Request`` hashes once, when
it is made.

``Request`` is the C type of ``_ids.c`` where that optional extension was compiled, and
the Python class below otherwise (``_PyRequest`` keeps it for the tests, which hold both
to the same behaviour). The C type is made in a tenth of the time, hashes without a
Python call and is not tracked by the garbage collector: the output cache holds a request
per row, and as Python objects they made each full collection walk the whole cache.
Static readers (type checkers, the API reference) see the Python class.

It stands for the tuple ``(variant, ids)`` wherever callers use one: unpacking, indexing,
``len``, equality (with another request or with that tuple) and hashing (the tuple's own
hash, so a cache lookup with a plain tuple finds it).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

from genlm.core._extensions import ids

__all__ = ["Request"]


class Request:
    """A validated request: the variant it was made for and its context's token ids.

    Args:
        variant: what besides the context selects the distribution (None: the base model).
        ids: the context's token ids, already validated.
    """

    __slots__ = ("_hash", "ids", "variant")

    def __init__(self, variant: Hashable, ids: tuple[int, ...]):
        self.variant = variant
        self.ids = ids
        self._hash = hash((variant, ids))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if type(other) is type(self):
            same = self._hash == other._hash and self.ids == other.ids
            return same and self.variant == other.variant
        if type(other) is tuple:
            return other == (self.variant, self.ids)
        return NotImplemented

    def __iter__(self) -> Iterator[Any]:
        return iter((self.variant, self.ids))

    def __getitem__(self, index: int | slice) -> Any:
        return (self.variant, self.ids)[index]

    def __len__(self) -> int:
        return 2

    def __reduce__(self) -> tuple[type[Request], tuple[Hashable, tuple[int, ...]]]:
        return (type(self), (self.variant, self.ids))

    def __repr__(self) -> str:
        return f"Request(variant={self.variant!r}, ids={self.ids!r})"


_PyRequest = Request


def _use_the_c_type() -> None:
    """Bind ``Request`` to the C type where ``_ids.c`` was built; else keep the class.

    At run time only (static readers see the class), and it keeps the class's behaviour.
    """
    global Request
    if ids is None:  # not built, or failing to load (``_extensions`` said why)
        return
    Request = ids.Request
    # Pickle finds a class by its qualified name: the Python class's must stay its own.
    _PyRequest.__qualname__ = "_PyRequest"


_use_the_c_type()
