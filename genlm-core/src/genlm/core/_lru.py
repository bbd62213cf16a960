"""``ByteLRU``: the least-recently-used map, bounded in bytes, under every GenLM cache.

The output cache (:class:`~genlm.core.backend.OutputCache`), the byte LM's mass cache
(genlm-bytes' ``MassCache``) and the prefix cache (:class:`~genlm.core.backend.PrefixCache`) keep
their entries in one, so all three follow the same rules:

* **Bytes.** An entry costs what its cache says when it is added, fixed while it is held;
  :attr:`ByteLRU.nbytes` is the sum over the held entries. A cache keyed by a token
  context counts the key with its value, by :func:`key_nbytes` (the output and mass
  caches). The prefix cache's keys are its trie nodes, host memory it documents as not
  counted (its budget is the backend's KV).
* **Too large.** An entry larger than the whole budget is not stored.
* **Duplicates.** Adding a key already held keeps the held entry, marks it most recently
  used and returns it: two concurrent misses computed the same result, which the cache
  holds and counts once (a caller may use what ``add`` returns to share that object; the
  scheduler delivers each computed row as it is).
* **Eviction.** Least recently used first, until the sum fits; pinned entries count
  towards the budget but are never evicted.
* **Shared blocks.** Entries added together may share one :class:`Block` of memory (the
  output cache's rows are views of their batch, so a held row keeps the whole batch
  alive). The block counts once, in full, while any entry sharing it is held, and each
  such entry counts its own bytes less the part the block covers. When an eviction
  leaves a block with held entries but the next entry in line is not one of its own (its
  run of entries in LRU order has ended: the others were used since, or pinned), those
  entries become copies of their own (the map's ``detach``) and the block stops counting:
  a few reused rows never keep whole batches alive. An entry that would be the first of
  its block to be held counts the block too, so it is stored only if both fit; a block
  of more than half the budget is not shared at all: its entries are stored as copies
  (two such batches could never be held together).
* **Clears.** Each :meth:`ByteLRU.clear` counts one :attr:`ByteLRU.generation`. A value
  computed from state read before the latest clear is not stored: a caller that reads
  the generation first and passes it to ``add``/``add_many`` gets its value back unheld
  if a clear came since (the output cache's batch rows, the mass cache's masses).
* **Locking.** Every method holds the map's reentrant :attr:`ByteLRU.lock`, so one map
  may be shared by the event loop and a worker thread. A cache with structure of its own
  (the prefix trie) holds the same lock around its updates; ``on_evict`` runs under it.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

import attrs

from genlm.core._request import Request
from genlm.core._validation import checked_count

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: What one token id costs in a key: a CPython int below 2**30.
_ITEM_BYTES = sys.getsizeof(2**20)
#: ``sys.getsizeof`` of a tuple of n items is ``_TUPLE_BYTES + _SLOT_BYTES * n``; computed
#: so, a key's size costs no ``__sizeof__`` call per tuple (key_nbytes runs every put).
_TUPLE_BYTES = sys.getsizeof(())
_SLOT_BYTES = sys.getsizeof((None,)) - _TUPLE_BYTES
_getsizeof = sys.getsizeof
_NONE_BYTES = sys.getsizeof(None)
#: What a :class:`Request` itself holds (its three slots and hash; its parts come on top).
_REQUEST_BYTES = sys.getsizeof(Request(None, ()))
#: What one more id costs a tuple of ids: its slot and its int.
_ID_BYTES = _SLOT_BYTES + _ITEM_BYTES


def key_nbytes(key: Hashable) -> int:
    """Estimated bytes held by a cache key: the one rule for keys that hold token contexts.

    ``sys.getsizeof`` of the key; for a tuple or a :class:`~genlm.core.backend.Request`,
    plus that of each part; for a tuple part (a context's token ids), plus 28 bytes (one
    int) per item. This is exact for a ``(variant, token ids)`` key whose ids are distinct
    objects and an upper bound when keys share int objects (small ints are shared), and it
    costs no walk over the ids. A 300-token context is about 10.9 KB of Python objects,
    more than a float32 row of a 2,000-token vocabulary, so it belongs in the budget.
    """
    if type(key) is Request:  # a model's key: its ids are a tuple (one call per put)
        variant = key.variant
        size = _REQUEST_BYTES + _TUPLE_BYTES + _ID_BYTES * len(key.ids)
        return size + (_NONE_BYTES if variant is None else _part_nbytes(variant))
    if type(key) is not tuple:
        return _getsizeof(key)
    size = _TUPLE_BYTES + _SLOT_BYTES * len(key)
    for part in key:
        size += _part_nbytes(part)
    return size


def _part_nbytes(part: object) -> int:
    """Bytes of one part of a key: a tuple of ids by the formula, None without a call."""
    if type(part) is tuple:
        return _TUPLE_BYTES + _ID_BYTES * len(part)
    if part is None:  # the usual variant; getsizeof costs a method lookup
        return _NONE_BYTES
    return _getsizeof(part)


@attrs.define(eq=False)
class Block:
    """Memory that several entries' values share (the batch whose rows they are views of).

    A :class:`ByteLRU` counts :attr:`nbytes` once while any entry added with the block is
    held; each such entry counts its own bytes less :attr:`covers`. The map alone reads and
    changes :attr:`held` and :attr:`keys`, under its lock.
    """

    #: Bytes of the shared memory (a batch's ``nbytes``).
    nbytes: int
    #: Bytes of each entry's own cost that the block holds (a row's ``nbytes``).
    covers: int
    #: How many held entries share it.
    held: int = 0
    #: Keys of its held entries, to find them when it breaks up (an insertion-ordered
    #: set: an entry that leaves takes its key out, so the block never keeps a dropped
    #: key alive beyond the budget's count).
    keys: dict[Any, None] = attrs.field(factory=dict)


class ByteLRU(Generic[K, V]):
    """Least-recently-used map bounded in bytes, with pinning; the rules are the module's.

    Args:
        max_bytes: budget for the sizes given to :meth:`add`; 0 stores nothing.
        on_evict: called as ``on_evict(key, value)`` for each entry evicted to fit (not
            for :meth:`pop` or :meth:`clear`), under :attr:`lock`.
        detach: ``detach(value)`` returns a copy of a value that shares a :class:`Block`,
            holding memory of its own; needed only by a map given blocks.

    Raises:
        TypeError: ``max_bytes`` is not a whole number.
        ValueError: a negative ``max_bytes``.

    Attributes:
        max_bytes: the budget (:meth:`resize` changes it).
        generation: how many times :meth:`clear` was called (see the module's rules).
        hits: :meth:`get` calls that found their key.
        misses: :meth:`get` calls that did not.
        lock: the reentrant lock every method holds.
    """

    def __init__(
        self,
        max_bytes: int,
        on_evict: Callable[[K, V], None] | None = None,
        detach: Callable[[V], V] | None = None,
    ):
        self.max_bytes = checked_count("max_bytes", max_bytes, 0, whole_floats=True)
        self._on_evict = on_evict
        self._detach = detach
        #: Unpinned entries, key -> (value, counted bytes, block or None), least recently
        #: used first. The counted bytes leave out the block's, counted once in ``_bytes``.
        self._lru: OrderedDict[K, tuple[V, int, Block | None]] = OrderedDict()
        #: Pinned entries, key -> ((value, counted bytes, block), number of pins).
        self._pinned: dict[K, tuple[tuple[V, int, Block | None], int]] = {}
        self._bytes = 0
        self.generation = 0
        self.lock = threading.RLock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._lru) + len(self._pinned)

    def __contains__(self, key: K) -> bool:
        return key in self._lru or key in self._pinned

    def is_pinned(self, key: K) -> bool:
        """Whether an entry is held for ``key`` and pinned."""
        return key in self._pinned

    @property
    def nbytes(self) -> int:
        """Bytes counted for the held entries, pinned ones included."""
        return self._bytes

    def get(self, key: K, *, touch: bool = True) -> V | None:
        """The value held for ``key``, or None; ``touch`` marks it most recently used."""
        with self.lock:
            entry = self._lru.get(key)
            if entry is not None:
                if touch:
                    self._lru.move_to_end(key)
                self.hits += 1
                return entry[0]
            # Each lookup hashes the whole key (tuples do not cache their hash): skip the
            # pinned map while it is empty, as it always is in the output cache.
            if self._pinned and key in self._pinned:
                self.hits += 1
                return self._pinned[key][0][0]
            self.misses += 1
            return None

    def get_many(self, keys: Iterable[K]) -> list[V | None]:
        """:meth:`get` each key, in order, under one hold of the lock (a batch of requests;
        each ``get`` takes the reentrant lock again, which costs no wait)."""
        with self.lock:
            return [self.get(key) for key in keys]

    def add(
        self, key: K, value: V, nbytes: int, *, pin: bool = False, generation: int | None = None
    ) -> V:
        """Hold ``value`` for ``key`` at a cost of ``nbytes`` and evict to fit.

        Args:
            key: the entry's key.
            value: what to hold.
            nbytes: what the entry costs against the budget.
            pin: also :meth:`pin` the entry held for ``key`` (this one or the one kept).
            generation: the :attr:`generation` read before ``value`` was computed; a
                :meth:`clear` since leaves ``value`` unheld (None: store regardless).

        Returns:
            The value now held for ``key``: the one already held if any (kept, marked most
            recently used), else ``value``. ``value`` is also returned, held by nothing,
            when it alone exceeds ``max_bytes``, or when pinned entries leave it no room and
            ``pin`` is false (a pinned entry is held even over the budget: pins are never
            evicted), or when ``generation`` is older than :attr:`generation`.

        Raises:
            TypeError: ``nbytes`` is not an integer.
            ValueError: ``nbytes`` is negative.
        """
        if type(nbytes) is not int or nbytes < 0:  # the usual int costs no call
            nbytes = checked_count("nbytes", nbytes, 0)
        with self.lock:
            if generation is not None and generation != self.generation:
                return value
            held = self._hold(key, value, nbytes)
            if pin and key in self:
                self._pin(key)
            if self._bytes > self.max_bytes:
                self._evict()
            return held

    def add_many(
        self,
        entries: Iterable[tuple[K, V, int]],
        block: Block | None = None,
        generation: int | None = None,
    ) -> list[V]:
        """:meth:`add` each ``(key, value, nbytes)`` in order, under one hold of the lock
        (a batch of results costs one lock, not one per row); what each ``add`` returns.

        Args:
            entries: the keys, values and their own costs.
            block: the memory every value of ``entries`` shares, if any (see the module's
                rules); each value's cost then includes the ``block.covers`` bytes of it.
            generation: as for :meth:`add`: a :meth:`clear` since leaves every value unheld.

        Raises:
            TypeError, ValueError: a size that is not an integer, or negative (the entries
                before it are held, each counted as it should be).
        """
        held = []
        with self.lock:
            if generation is not None and generation != self.generation:
                return [value for _, value, _ in entries]
            if block is not None and 2 * block.nbytes > self.max_bytes:
                # Too large to share: each entry that is stored becomes a copy of its own.
                entries = self._copies(entries)
                block = None
            for key, value, nbytes in entries:
                if type(nbytes) is not int or nbytes < 0:  # one test per row on the hot path
                    nbytes = checked_count("nbytes", nbytes, 0)
                held.append(self._hold(key, value, nbytes, block))
                if self._bytes > self.max_bytes:
                    self._evict()
        return held

    def _copies(self, entries: Iterable[tuple[K, V, int]]) -> Iterable[tuple[K, V, int]]:
        """``entries`` whose values would be stored, detached from their block: a held key
        or an entry over the whole budget is passed on as it is (nothing is stored)."""
        for key, value, nbytes in entries:
            if nbytes <= self.max_bytes and key not in self:
                value = self._detach(value)  # type: ignore[misc] - given with blocks
            yield key, value, nbytes

    def _hold(self, key: K, value: V, nbytes: int, block: Block | None = None) -> V:
        """Hold ``value`` for ``key`` unpinned, or keep (and touch, if unpinned) the entry
        already held; no pin, no eviction (lock held). Returns what ``add`` returns."""
        if self._pinned:
            pinned = self._pinned.get(key)
            if pinned is not None:
                return pinned[0][0]
        cost = nbytes
        if block is not None:
            nbytes -= block.covers
            cost = nbytes if block.held else nbytes + block.nbytes
        new = (value, nbytes, block)
        if cost <= self.max_bytes:
            entry = self._lru.setdefault(key, new)  # one hash of the key, held or not
        else:
            entry = self._lru.get(key, new)
            if entry is new:
                return value
        if entry is new:
            self._bytes += cost
            if block is not None:
                block.held += 1
                block.keys[key] = None
        else:
            self._lru.move_to_end(key)
        return entry[0]

    def resize(self, max_bytes: int) -> None:
        """Set the budget and evict to fit now (for a budget known only once a model is
        loaded: the genlm-backend facade sizes its output cache in rows).

        Raises:
            TypeError: ``max_bytes`` is not a whole number.
            ValueError: a negative ``max_bytes``.
        """
        max_bytes = checked_count("max_bytes", max_bytes, 0, whole_floats=True)
        with self.lock:
            self.max_bytes = max_bytes
            self._evict()

    def pin(self, key: K) -> None:
        """Protect the entry of ``key`` from eviction (counted: pin twice, unpin twice).

        Raises:
            KeyError: nothing is held for ``key``.
        """
        with self.lock:
            if key not in self:
                raise KeyError(key)
            self._pin(key)

    def unpin(self, key: K) -> None:
        """Undo one :meth:`pin`; with no pins left the entry becomes the most recently used.

        Raises:
            KeyError: no pinned entry is held for ``key``.
        """
        with self.lock:
            entry, pins = self._pinned[key]
            if pins > 1:
                self._pinned[key] = (entry, pins - 1)
                return
            del self._pinned[key]
            self._lru[key] = entry
            self._evict()

    def pop(self, key: K) -> bool:
        """Drop the entry of ``key``, pinned or not; whether there was one."""
        with self.lock:
            entry = self._lru.pop(key, None)
            if entry is None:
                pinned = self._pinned.pop(key, None) if self._pinned else None
                if pinned is None:
                    return False
                entry = pinned[0]
            self._bytes -= entry[1]
            if entry[2] is not None:
                self._release(entry[2], key)
            return True

    def evictable(self) -> list[K]:
        """The unpinned keys, least recently used first."""
        with self.lock:
            return list(self._lru)

    def items(self) -> list[tuple[K, V]]:
        """The held entries: the unpinned ones least recently used first, then the pinned."""
        with self.lock:
            held = [(key, entry[0]) for key, entry in self._lru.items()]
            return held + [(key, entry[0]) for key, (entry, _) in self._pinned.items()]

    def clear(self) -> None:
        """Drop every entry, pinned ones included (the hit and miss counters are kept),
        and count one :attr:`generation`."""
        with self.lock:  # blocks go with their entries: each batch's is made for one put
            self.generation += 1
            self._lru.clear()
            self._pinned.clear()
            self._bytes = 0

    def _pin(self, key: K) -> None:
        """One more pin on a held entry (the lock is held)."""
        entry = self._lru.pop(key, None)
        if entry is not None:
            self._pinned[key] = (entry, 1)
        else:
            held, pins = self._pinned[key]
            self._pinned[key] = (held, pins + 1)

    def _evict(self) -> None:
        """Evict least recently used unpinned entries until the budget holds (lock held)."""
        lru, on_evict = self._lru, self._on_evict
        while self._bytes > self.max_bytes and lru:
            key, (value, nbytes, block) = lru.popitem(last=False)
            self._bytes -= nbytes
            if block is not None:
                self._release(block, key)
                # Its run in LRU order has ended but entries of it are held elsewhere.
                if block.held and (not lru or next(iter(lru.values()))[2] is not block):
                    self._break_up(block)
            if on_evict is not None:
                on_evict(key, value)

    def _release(self, block: Block, key: K) -> None:
        """The entry of ``key`` no longer shares ``block``; the last one takes its bytes
        (lock held)."""
        del block.keys[key]
        block.held -= 1
        if not block.held:
            self._bytes -= block.nbytes

    def _break_up(self, block: Block) -> None:
        """Replace the held entries of ``block`` by copies of their own, in place (their
        order and pins kept), and stop counting the block (lock held)."""

        def detached(entry: tuple[V, int, Block | None]) -> tuple[V, int, None]:
            value, nbytes, _ = entry
            return self._detach(value), nbytes + block.covers, None  # type: ignore[misc]

        # Every copy is made before any entry changes: one that fails (MemoryError, a
        # device out of memory) leaves the block and the byte count as they were.
        copies: list[tuple[dict, K, Any]] = []
        for key in block.keys:
            entry = self._lru.get(key)
            if entry is not None and entry[2] is block:
                copies.append((self._lru, key, detached(entry)))
                continue
            pinned = self._pinned.get(key) if self._pinned else None
            if pinned is not None and pinned[0][2] is block:
                copies.append((self._pinned, key, (detached(pinned[0]), pinned[1])))
        for table, key, value in copies:
            table[key] = value  # an existing key: its place in LRU order is kept
        # Every held entry of the block was detached: each now counts the part it covered.
        self._bytes += block.covers * block.held - block.nbytes
        block.held = 0
        block.keys.clear()
