"""Stateful tests of the byte-bounded caches against plain reference models.

After any sequence of operations, the bytes a cache counts equal the sum over the entries
it holds (computed independently), the budget holds, the LRU order matches the model,
pinned entries stay, a second put of a held key keeps the held entry, and no trie node
outlives the entries that need it. The shared LRU (``genlm.core._lru.ByteLRU``) is checked
on its own too, eviction callbacks included.
"""

import sys
import threading
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from genlm.core._lru import ByteLRU
from genlm.core._rows import numpy_rows
from genlm.core.backend import OutputCache, PrefixCache

SETTINGS = settings(max_examples=40, stateful_step_count=30, deadline=None)

# Keys as a model makes them: (variant, token ids). Ids from 1000 up are distinct int
# objects, so sys.getsizeof summed over the key's objects is the memory it really holds.
variants = st.sampled_from([None, "adapter"])
token_ids = st.lists(st.integers(1000, 1003), min_size=1, max_size=12).map(tuple)
keys = st.tuples(variants, token_ids)


def real_key_bytes(key) -> int:
    variant, ids = key
    return sum(map(sys.getsizeof, [key, variant, ids, *ids]))


class OutputCacheMachine(RuleBasedStateMachine):
    @initialize(budget=st.integers(0, 3000))
    def make(self, budget):
        self.cache = OutputCache(budget)
        self.model: OrderedDict = OrderedDict()  # key -> counted bytes, oldest first

    def _model_put(self, key, size):
        if key in self.model:  # the held entry is kept, counted as it was
            self.model.move_to_end(key)
            return
        if size > self.cache.max_bytes:
            return
        self.model[key] = size
        while sum(self.model.values()) > self.cache.max_bytes:
            self.model.popitem(last=False)

    @rule(key=keys, floats=st.integers(0, 200))
    def put(self, key, floats):
        self.cache.put(key, np.zeros(floats, dtype=np.float32))
        self._model_put(key, 4 * floats + real_key_bytes(key))

    @rule(key=keys, floats=st.integers(0, 200))
    def concurrent_misses(self, key, floats):
        """Two threads computed the same row and both store it: one entry, counted once."""
        threads = [
            threading.Thread(target=self.cache.put, args=(key, np.zeros(floats, np.float32)))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._model_put(key, 4 * floats + real_key_bytes(key))

    @rule(
        batch=st.lists(st.tuples(keys, st.integers(0, 200)), max_size=4, unique_by=lambda e: e[0])
    )
    def put_many(self, batch):
        """A batch's rows: as if put one by one."""
        rows = [np.zeros(floats, dtype=np.float32) for _, floats in batch]
        held = self.cache.put_many([key for key, _ in batch], rows)
        assert len(held) == len(batch) and all(not row.flags.writeable for row in rows)
        for key, floats in batch:
            self._model_put(key, 4 * floats + real_key_bytes(key))

    @rule(key=keys)
    def get(self, key):
        row = self.cache.get(key)
        assert (row is not None) == (key in self.model)
        if key in self.model:
            self.model.move_to_end(key)

    @rule()
    def clear(self):
        self.cache.clear()
        self.model.clear()

    @invariant()
    def accounting_matches_the_held_entries(self):
        held = self.cache.items()
        assert [k for k, _ in held] == list(self.model)
        counted = sum(v.nbytes + real_key_bytes(k) for k, v in held)
        assert self.cache.nbytes == counted == sum(self.model.values())
        assert self.cache.nbytes <= self.cache.max_bytes and len(self.cache) == len(self.model)


prefixes = st.lists(st.integers(0, 2), min_size=1, max_size=4).map(tuple)


class PinModel:
    """The pin rules both pinning caches follow, against a model: ``self.pins`` (pins per
    held key) and ``self.lru`` (the unpinned keys, oldest first); ``self._evict`` evicts
    from the model what the cache must have evicted."""

    def check_pin(self, key, held: bool) -> None:
        """A pin on a held entry takes it out of the LRU order; on nothing, KeyError."""
        if not held:
            with pytest.raises(KeyError):
                self.cache.pin(key)
            return
        self.cache.pin(key)
        self.pins[key] += 1
        self.lru.pop(key, None)

    def check_shrink(self, budget) -> None:
        """A smaller budget evicts to fit at once (the genlm-backend facade resizes its
        cache)."""
        self.cache.resize(min(budget, self.cache.max_bytes))
        self._evict()

    def check_unpin(self, key) -> None:
        """The last unpin makes the entry the most recently used, and may evict to fit."""
        if not self.pins.get(key):
            with pytest.raises(KeyError):
                self.cache.unpin(key)
            return
        self.cache.unpin(key)
        self.pins[key] -= 1
        if not self.pins[key]:
            self.lru[key] = None
            self._evict()


#: Keys of one to three ids: small next to the rows, so that several batches fit a budget.
short_keys = st.tuples(
    variants, st.lists(st.integers(1000, 1002), min_size=1, max_size=3).map(tuple)
)


class BatchRowsMachine(PinModel, RuleBasedStateMachine):
    """The output cache holding computed batches as views (the shared-block rule), against
    a model of the rule and against the memory the held arrays really keep alive.

    A batch counts once, in full, while any of its rows is held; an eviction that ends its
    run in LRU order while rows of it are held elsewhere makes those rows copies; a batch
    of more than half the budget is stored as copies. Whatever happens, the bytes the cache
    counts equal the keys' bytes plus the distinct memory its arrays hold (a view's whole
    base, once), and every held row keeps the values it was computed with.
    """

    @initialize(budget=st.integers(0, 6000))
    def make(self, budget):
        self.cache = OutputCache(budget)
        self.lru: OrderedDict = OrderedDict()  # unpinned keys, oldest first
        self.pins: dict = {}
        self.info: dict = {}  # key -> [block or None, key bytes, row bytes, stamp]
        self.blocks: dict = {}  # block id -> [nbytes, rows held]
        self.stamp = 0

    def _counted(self) -> int:
        rows = sum(kb + (rb if block is None else 0) for block, kb, rb, _ in self.info.values())
        return rows + sum(nbytes for nbytes, held in self.blocks.values() if held)

    def _hold(self, key, block, row_bytes, stamp):
        if key in self.info:  # the held entry is kept (and touched, unless pinned)
            if key in self.lru:
                self.lru.move_to_end(key)
            return
        key_bytes = real_key_bytes(key)
        cost = key_bytes + row_bytes
        if block is not None:
            nbytes, held = self.blocks[block]
            cost = key_bytes + (0 if held else nbytes)
        if cost > self.cache.max_bytes:
            return
        self.info[key] = [block, key_bytes, row_bytes, stamp]
        self.lru[key] = None
        self.pins[key] = 0
        if block is not None:
            self.blocks[block][1] += 1
        self._evict()

    def _evict(self):
        while self._counted() > self.cache.max_bytes and self.lru:
            key = next(iter(self.lru))
            del self.lru[key], self.pins[key]
            block = self.info.pop(key)[0]
            if block is None:
                continue
            self.blocks[block][1] -= 1
            after = next(iter(self.lru), None)
            if self.blocks[block][1] and (after is None or self.info[after][0] != block):
                for entry in self.info.values():  # its rows held elsewhere become copies
                    if entry[0] == block:
                        entry[0] = None
                self.blocks[block][1] = 0

    @rule(
        batch=st.lists(short_keys, min_size=1, max_size=5, unique=True),
        width=st.integers(1, 60),
    )
    def put_batch(self, batch, width):
        """A computed batch, as ``BatchedLM._run_requests`` hands it over."""
        rows = np.zeros((len(batch), width), dtype=np.float32)
        stamps = range(self.stamp, self.stamp + len(batch))
        self.stamp += len(batch)
        rows[:, 0] = stamps
        held = self.cache.put_many(batch, numpy_rows(rows, stable=True))
        assert len(held) == len(batch)
        block = None
        if 2 * rows.nbytes <= self.cache.max_bytes:
            block = len(self.blocks)
            self.blocks[block] = [rows.nbytes, 0]
        for key, stamp in zip(batch, stamps):
            self._hold(key, block, 4 * width, stamp)

    @rule(key=short_keys, width=st.integers(1, 60))
    def put(self, key, width):
        row = np.full(width, self.stamp, dtype=np.float32)
        self.cache.put(key, row)
        self._hold(key, None, 4 * width, self.stamp)
        self.stamp += 1

    def _held(self, index):
        """One of the held keys (drawn keys are rarely held: rows are reused by these)."""
        return list(self.info)[index % len(self.info)] if self.info else None

    @rule(key=short_keys)
    def get(self, key):
        row = self.cache.get(key)
        assert (row is not None) == (key in self.info)
        if key in self.lru:
            self.lru.move_to_end(key)

    @rule(index=st.integers(0, 50))
    def reuse(self, index):
        """A held row read again: it leaves its batch's run in LRU order."""
        if (key := self._held(index)) is not None:
            self.get(key)

    @rule(
        index=st.integers(0, 50), batch=st.lists(short_keys, max_size=3), width=st.integers(1, 60)
    )
    def put_batch_with_a_held_key(self, index, batch, width):
        """Two concurrent misses computed the same row: the held one is kept."""
        if (key := self._held(index)) is not None:
            self.put_batch(list(dict.fromkeys([*batch, key])), width)

    @rule(index=st.integers(0, 50))
    def pin(self, index):
        if (key := self._held(index)) is not None:
            self.check_pin(key, held=True)

    @rule(index=st.integers(0, 50))
    def unpin(self, index):
        if (key := self._held(index)) is not None:
            self.check_unpin(key)

    @rule(budget=st.integers(0, 4000))
    def shrink_budget(self, budget):
        self.check_shrink(budget)

    @rule()
    def clear(self):
        self.cache.clear()
        self.lru.clear(), self.pins.clear(), self.info.clear()
        for block in self.blocks.values():
            block[1] = 0

    @invariant()
    def counted_bytes_are_the_memory_really_held(self):
        held = self.cache.items()
        assert [k for k, _ in held][: len(self.lru)] == list(self.lru)
        assert {k for k, _ in held} == set(self.info)
        assert self.cache.nbytes == self._counted()
        memory = {}
        for key, row in held:
            owner = row if row.base is None else row.base
            memory[id(owner)] = owner.nbytes
            assert not row.flags.writeable and row[0] == self.info[key][3]
            assert (row.base is None) == (self.info[key][0] is None)
        assert self.cache.nbytes == sum(real_key_bytes(k) for k, _ in held) + sum(memory.values())
        if not any(self.pins.values()):
            assert self.cache.nbytes <= self.cache.max_bytes


class PrefixCacheMachine(PinModel, RuleBasedStateMachine):
    @initialize(budget=st.integers(0, 100))
    def make(self, budget):
        self.cache = PrefixCache(budget)
        self.sizes: dict[tuple, int] = {}
        self.pins: dict[tuple, int] = {}
        self.lru: OrderedDict = OrderedDict()  # unpinned entries, oldest first

    def _drop(self, tokens):
        del self.sizes[tokens], self.pins[tokens]
        self.lru.pop(tokens, None)

    def _evict(self):
        while sum(self.sizes.values()) > self.cache.max_bytes and self.lru:
            self._drop(next(iter(self.lru)))

    def _value(self, tokens):
        """What the cache holds for ``tokens``: the first insert's value (it tags its size)."""
        return tokens + (self.sizes[tokens],)

    def _touch(self, tokens):
        if tokens in self.lru:
            self.lru.move_to_end(tokens)

    @rule(tokens=prefixes, size=st.integers(0, 40), pin=st.booleans())
    def insert(self, tokens, size, pin):
        stored = self.cache.insert(list(tokens), tokens + (size,), size, pin=pin)
        if tokens not in self.sizes and size > self.cache.max_bytes:  # refused
            assert stored is False
        else:
            self.sizes.setdefault(tokens, size)  # an entry already there is kept
            self.pins[tokens] = self.pins.get(tokens, 0) + pin
            if self.pins[tokens]:
                self.lru.pop(tokens, None)
            else:
                self.lru[tokens] = None
                self.lru.move_to_end(tokens)
            self._evict()
            assert stored == (tokens in self.sizes)

    @rule(tokens=prefixes)
    def pin(self, tokens):
        self.check_pin(tokens, held=tokens in self.sizes)

    @rule(tokens=prefixes)
    def unpin(self, tokens):
        self.check_unpin(tokens)

    @rule(tokens=prefixes)
    def remove(self, tokens):
        assert self.cache.remove(tokens) == (tokens in self.sizes)
        if tokens in self.sizes:
            self._drop(tokens)

    @rule(keep_pinned=st.booleans())
    def clear(self, keep_pinned):
        self.cache.clear(keep_pinned=keep_pinned)
        for tokens in list(self.lru if keep_pinned else self.sizes):
            self._drop(tokens)

    @rule(query=st.lists(st.integers(0, 2), max_size=6), limit=st.none() | st.integers(0, 6))
    def longest_prefix(self, query, limit):
        cap = len(query) if limit is None else min(limit, len(query))
        found = [n for n in range(cap, 0, -1) if tuple(query[:n]) in self.sizes]
        hit = self.cache.longest_prefix(query, max_length=limit)
        if found:
            best = tuple(query[: found[0]])
            assert (hit.length, hit.value) == (found[0], self._value(best))
            self._touch(best)
        else:
            assert (hit.length, hit.value) == (0, None)

    @rule(tokens=prefixes)
    def get(self, tokens):
        assert self.cache.get(tokens) == (self._value(tokens) if tokens in self.sizes else None)
        self._touch(tokens)

    @invariant()
    def accounting_matches_the_held_entries(self):
        assert self.cache.nbytes == sum(self.sizes.values()) and len(self.cache) == len(self.sizes)
        assert all(tokens in self.cache for tokens in self.sizes)  # pinned ones included
        over = self.cache.nbytes > self.cache.max_bytes
        assert not over or not self.lru  # only pinned entries may exceed the budget
        values = dict(self.cache._lru.items())
        assert [values[node] for node in self.cache._lru.evictable()] == [
            self._value(tokens) for tokens in self.lru
        ]

    @invariant()
    def trie_holds_only_prefixes_of_entries(self):
        needed = {t[:n] for t in self.sizes for n in range(1, len(t) + 1)}
        nodes, stack = 0, list(self.cache._root.children.values())
        while stack:
            node = stack.pop()
            nodes += 1
            stack.extend(node.children.values())
        assert nodes == len(needed)


lru_keys = st.integers(0, 5)


class ByteLRUMachine(PinModel, RuleBasedStateMachine):
    """The LRU every cache shares, against a model: entries, pins, order and evictions."""

    @initialize(budget=st.integers(0, 100))
    def make(self, budget):
        self.evicted: list = []
        self.cache = ByteLRU(budget, on_evict=lambda key, value: self.evicted.append(key))
        self.entries: dict = {}  # key -> (value, size)
        self.pins: dict = {}
        self.lru: OrderedDict = OrderedDict()  # unpinned keys, oldest first
        self.expected_evictions: list = []
        self.serial = 0

    def _evict(self):
        while sum(size for _, size in self.entries.values()) > self.cache.max_bytes and self.lru:
            key, _ = self.lru.popitem(last=False)
            del self.entries[key], self.pins[key]
            self.expected_evictions.append(key)

    @rule(key=lru_keys, size=st.integers(0, 40), pin=st.booleans())
    def add(self, key, size, pin):
        self.serial += 1
        value = ("value", self.serial)
        held = self.cache.add(key, value, size, pin=pin)
        if key in self.entries:  # kept, touched, pinned once more if asked
            assert held == self.entries[key][0]
            self.pins[key] += pin
            if key in self.lru:
                self.lru.move_to_end(key)
        else:
            assert held is value
            if size > self.cache.max_bytes:
                return
            self.entries[key], self.pins[key] = (value, size), int(pin)
            if not pin:
                self.lru[key] = None
        if self.pins[key]:
            self.lru.pop(key, None)
        self._evict()

    @rule(batch=st.lists(st.tuples(lru_keys, st.integers(0, 40)), max_size=4))
    def add_many(self, batch):
        """Under one lock, what adding each in turn holds and returns."""
        expected, entries = [], []
        for key, size in batch:
            self.serial += 1
            value = ("value", self.serial)
            entries.append((key, value, size))
            if key in self.entries:
                expected.append(self.entries[key][0])
                if key in self.lru:
                    self.lru.move_to_end(key)
            else:
                expected.append(value)
                if size <= self.cache.max_bytes:
                    self.entries[key], self.pins[key] = (value, size), 0
                    self.lru[key] = None
            self._evict()
        assert self.cache.add_many(entries) == expected

    @rule(keys=st.lists(lru_keys, max_size=4))
    def get_many(self, keys):
        assert self.cache.get_many(keys) == [
            self.entries[key][0] if key in self.entries else None for key in keys
        ]
        for key in keys:
            if key in self.lru:
                self.lru.move_to_end(key)

    @rule(key=lru_keys, touch=st.booleans())
    def get(self, key, touch):
        hits = self.cache.hits
        found = self.cache.get(key, touch=touch)
        assert found == (self.entries[key][0] if key in self.entries else None)
        assert self.cache.hits == hits + (key in self.entries)
        if touch and key in self.lru:
            self.lru.move_to_end(key)

    @rule(key=lru_keys)
    def pin(self, key):
        self.check_pin(key, held=key in self.entries)

    @rule(key=lru_keys)
    def unpin(self, key):
        self.check_unpin(key)

    @rule(key=lru_keys)
    def pop(self, key):
        assert self.cache.pop(key) == (key in self.entries)
        if key in self.entries:
            del self.entries[key], self.pins[key]
            self.lru.pop(key, None)

    @rule(budget=st.integers(0, 100))
    def shrink_budget(self, budget):
        self.check_shrink(budget)

    @rule()
    def clear(self):
        self.cache.clear()
        self.entries.clear(), self.pins.clear(), self.lru.clear()

    @invariant()
    def accounting_matches_the_held_entries(self):
        pinned = [key for key in self.entries if key not in self.lru]
        expected = [(key, self.entries[key][0]) for key in [*self.lru, *pinned]]
        assert sorted(self.cache.items()[len(self.lru) :]) == sorted(expected[len(self.lru) :])
        assert self.cache.items()[: len(self.lru)] == expected[: len(self.lru)]
        assert self.cache.evictable() == list(self.lru)
        assert self.cache.nbytes == sum(size for _, size in self.entries.values())
        assert len(self.cache) == len(self.entries)
        assert all(key in self.cache for key in self.entries)
        assert self.evicted == self.expected_evictions  # on_evict saw exactly the evictions


TestByteLRUState = ByteLRUMachine.TestCase
TestByteLRUState.settings = SETTINGS
TestOutputCacheState = OutputCacheMachine.TestCase
TestOutputCacheState.settings = SETTINGS
TestBatchRowsState = BatchRowsMachine.TestCase
TestBatchRowsState.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestPrefixCacheState = PrefixCacheMachine.TestCase
TestPrefixCacheState.settings = SETTINGS


class _Key:
    """A hashable key that can be watched with a weakref."""

    def __init__(self, n: int):
        self.n = n

    def __hash__(self) -> int:
        return self.n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and other.n == self.n


@pytest.mark.parametrize("leave", ["evicted", "popped"])
def test_a_block_keeps_no_key_of_an_entry_that_left(leave):
    """Entries of one block that are evicted (while the rest of its run stays held) or
    popped leave no key behind: the block held every key it was added with, uncounted,
    while any of its entries was held (long contexts' keys kept alive past the budget)."""
    import gc
    import weakref

    from genlm.core._lru import Block

    cache = ByteLRU(100, detach=lambda value: value)
    keys = [_Key(i) for i in range(8)]
    watched = [weakref.ref(key) for key in keys]
    block = Block(nbytes=16, covers=2)
    cache.add_many([(key, f"row {key.n}", 10) for key in keys], block)
    assert cache.nbytes == 8 * 8 + 16  # each entry's own 8 bytes, the block once
    if leave == "evicted":
        cache.resize(16 + 3 * 8)  # the oldest five go; the block's run goes on
    else:
        assert all([cache.pop(k) for k in keys[:5]])
    del keys
    gc.collect()
    assert [ref() is None for ref in watched] == [True] * 5 + [False] * 3
    assert [k.n for k in cache.evictable()] == [5, 6, 7]
