"""Stateful tests of the byte-bounded caches against plain reference models.

After any sequence of operations, the bytes a cache counts equal the sum over the entries
it holds (computed independently), the budget holds, the LRU order matches the model,
pinned entries stay, and no trie node outlives the entries that need it.
"""

import sys
import threading
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

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
        if size > self.cache.max_bytes:
            return
        self.model.pop(key, None)
        self.model[key] = size
        while sum(self.model.values()) > self.cache.max_bytes:
            self.model.popitem(last=False)

    @rule(key=keys, floats=st.integers(0, 200))
    def put(self, key, floats):
        self.cache.put(key, np.zeros(floats, dtype=np.float32))
        self._model_put(key, 4 * floats + real_key_bytes(key))

    @rule(key=keys, floats=st.integers(0, 200))
    def concurrent_misses(self, key, floats):
        """Two threads computed the same row and both store it."""
        threads = [
            threading.Thread(target=self.cache.put, args=(key, np.zeros(floats, np.float32)))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
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
        held = list(self.cache._data)
        assert held == list(self.model)
        counted = sum(v.nbytes + real_key_bytes(k) for k, (v, _) in self.cache._data.items())
        assert self.cache.nbytes == counted == sum(self.model.values())
        assert self.cache.nbytes <= self.cache.max_bytes and len(self.cache) == len(self.model)


prefixes = st.lists(st.integers(0, 2), min_size=1, max_size=4).map(tuple)


class PrefixCacheMachine(RuleBasedStateMachine):
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

    def _touch(self, tokens):
        if tokens in self.lru:
            self.lru.move_to_end(tokens)

    @rule(tokens=prefixes, size=st.integers(0, 40), pin=st.booleans())
    def insert(self, tokens, size, pin):
        stored = self.cache.insert(list(tokens), tokens, size, pin=pin)
        if size > self.cache.max_bytes:  # refused; an entry already there stays as it was
            assert stored is False
        else:
            self.sizes[tokens] = size
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
        if tokens not in self.sizes:
            with pytest.raises(KeyError):
                self.cache.pin(tokens)
            return
        self.cache.pin(tokens)
        self.pins[tokens] += 1
        self.lru.pop(tokens, None)

    @rule(tokens=prefixes)
    def unpin(self, tokens):
        if not self.pins.get(tokens):
            with pytest.raises(KeyError):
                self.cache.unpin(tokens)
            return
        self.cache.unpin(tokens)
        self.pins[tokens] -= 1
        if not self.pins[tokens]:
            self.lru[tokens] = None
        self._evict()

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
            assert (hit.length, hit.value) == (found[0], tuple(query[: found[0]]))
            self._touch(tuple(query[: found[0]]))
        else:
            assert (hit.length, hit.value) == (0, None)

    @rule(tokens=prefixes)
    def get(self, tokens):
        assert self.cache.get(tokens) == (tokens if tokens in self.sizes else None)
        self._touch(tokens)

    @invariant()
    def accounting_matches_the_held_entries(self):
        assert self.cache.nbytes == sum(self.sizes.values()) and len(self.cache) == len(self.sizes)
        assert all(tokens in self.cache for tokens in self.sizes)  # pinned ones included
        over = self.cache.nbytes > self.cache.max_bytes
        assert not over or not self.lru  # only pinned entries may exceed the budget
        assert [node.value for node in self.cache._lru] == list(self.lru)

    @invariant()
    def trie_holds_only_prefixes_of_entries(self):
        needed = {t[:n] for t in self.sizes for n in range(1, len(t) + 1)}
        nodes, stack = 0, list(self.cache._root.children.values())
        while stack:
            node = stack.pop()
            nodes += 1
            stack.extend(node.children.values())
        assert nodes == len(needed)


TestOutputCacheState = OutputCacheMachine.TestCase
TestOutputCacheState.settings = SETTINGS
TestPrefixCacheState = PrefixCacheMachine.TestCase
TestPrefixCacheState.settings = SETTINGS
