"""Output cache and prefix cache: bounds, LRU order, longest-prefix lookups, pinning."""

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genlm.core.backend import (
    BatchRows,
    OutputCache,
    PrefixCache,
    Request,
    compact_row,
    key_nbytes,
)


class TestOutputCache:
    def test_lru_eviction_respects_the_byte_budget(self):
        """The least recently used arrays go first, and the total never exceeds the budget."""
        entry = 400 + sys.getsizeof(1000)  # a 400-byte row and its int key
        cache = OutputCache(max_bytes=3 * entry)
        for i in range(1000, 1003):
            cache.put(i, np.zeros(100, dtype=np.float32))
        assert cache.get(1000) is not None  # 1000 becomes most recent
        cache.put(1003, np.zeros(100, dtype=np.float32))
        assert cache.get(1001) is None and cache.get(1000) is not None
        assert cache.get(1003) is not None
        assert cache.nbytes == 3 * entry and len(cache) == 3

    def test_values_are_read_only_and_oversized_ones_skipped(self):
        """Stored arrays are read-only; an array bigger than the budget is not kept."""
        cache = OutputCache(max_bytes=200)
        stored = cache.put("a", np.zeros(10, dtype=np.float32))
        with pytest.raises(ValueError):
            stored[0] = 1.0
        cache.put("big", np.zeros(1000, dtype=np.float32))
        assert cache.get("big") is None and cache.nbytes == 40 + sys.getsizeof("a")

    def test_key_bytes_are_counted(self):
        """A 300-token key counts with its row: its tuples and ints, as sys.getsizeof sums them."""
        ids = tuple(range(1000, 1300))  # distinct int objects, as a tokenizer produces
        key = ("adapter", ids)
        real = sum(map(sys.getsizeof, [key, "adapter", ids, *ids]))
        assert real > 10_000
        cache = OutputCache(max_bytes=10**6)
        cache.put(key, np.zeros(100, dtype=np.float32))
        assert cache.nbytes == 400 + real
        first = cache.get(key)
        again = cache.put(key, np.zeros(50, dtype=np.float32))  # a second put keeps the first
        assert again is first and cache.get(key) is first and cache.nbytes == 400 + real

    def test_budget_holds_for_long_keys(self):
        """Rows with long keys are evicted by their real size: 10 of them do not fit in 20 KB."""
        cache = OutputCache(max_bytes=20_000)
        keys = [(None, tuple(range(1000 + i, 1300 + i))) for i in range(10)]
        for key in keys:
            cache.put(key, np.zeros(100, dtype=np.float32))
        held = [k for k in keys if cache.get(k) is not None]
        real = sum(400 + sum(map(sys.getsizeof, [k, None, k[1], *k[1]])) for k in held)
        assert held == keys[-1:] and cache.nbytes == real <= 20_000

    def test_resize_evicts_the_least_recent_to_fit(self):
        """Shrinking keeps the most recently used entries that fit; a bad budget is refused."""
        entry = 400 + sys.getsizeof(1000)
        cache = OutputCache(max_bytes=4 * entry)
        for i in range(1000, 1004):
            cache.put(i, np.zeros(100, dtype=np.float32))
        cache.get(1000)  # most recent now: 1001, 1002, 1003, 1000
        cache.resize(2 * entry + 1)
        assert [k for k in range(1000, 1004) if cache.get(k) is not None] == [1000, 1003]
        assert cache.nbytes == 2 * entry and cache.max_bytes == 2 * entry + 1
        cache.resize(0)
        assert len(cache) == 0 and cache.nbytes == 0
        with pytest.raises(ValueError, match="max_bytes must be >= 0"):
            cache.resize(-1)
        for bad in (2.5, float("nan"), True, "100"):
            with pytest.raises(TypeError, match="max_bytes must be an integer"):
                cache.resize(bad)
            with pytest.raises(TypeError, match="max_bytes must be an integer"):
                OutputCache(max_bytes=bad)
        assert cache.max_bytes == 0
        cache.resize(1e3)  # a budget written as a whole float is taken, as an int
        assert cache.max_bytes == 1000 and type(cache.max_bytes) is int
        cache.resize(2**1100)  # an int beyond float range is an int still
        assert cache.max_bytes == 2**1100

    def test_a_failed_row_copy_leaves_the_byte_count_exact(self, monkeypatch):
        """When an eviction ends a batch's run and the copy of one of its rows held elsewhere
        fails (MemoryError, a device out of memory), the error reaches the caller and the
        cache still counts exactly what it holds. It swapped copies in one by one and fixed
        its count after the loop: the count stayed wrong, 768 bytes with nothing held."""
        cache = OutputCache(10_000)
        keys = [Request(None, (i,)) for i in range(4)]
        batch = np.zeros((4, 64), np.float32)
        batch.setflags(write=False)
        cache.put_many(keys, BatchRows(batch, batch))  # one block of 4 rows
        cache.put(Request(None, (9,)), np.zeros(64, np.float32))
        for key in keys[1:]:
            cache.get(key)  # LRU order: (0,), (9,), (1,), (2,), (3,)
        copies = []

        def copy_or_fail(row):
            copies.append(row)
            if len(copies) == 2:
                raise MemoryError("copy failed")
            return compact_row(row)

        monkeypatch.setattr(cache, "_detach", copy_or_fail)
        with pytest.raises(MemoryError):
            cache.resize(cache.nbytes - 1)  # evicts (0,): the rest of its batch is copied

        def held_bytes() -> int:  # keys, plus each distinct array memory once
            bases = {id(v.base if v.base is not None else v): v for _, v in cache.items()}
            arrays = sum((v.base if v.base is not None else v).nbytes for v in bases.values())
            return arrays + sum(key_nbytes(k) for k, _ in cache.items())

        assert cache.nbytes == held_bytes()
        for key in [*keys, Request(None, (9,))]:
            cache.pop(key)
        assert len(cache) == 0 and cache.nbytes == 0

    def test_zero_budget_disables_caching(self):
        """max_bytes=0 stores nothing."""
        cache = OutputCache(0)
        cache.put(1, np.zeros(1, dtype=np.float32))
        assert cache.get(1) is None


prefixes = st.lists(st.integers(0, 3), min_size=1, max_size=6)


class TestPrefixCache:
    @settings(max_examples=200, deadline=None)
    @given(stored=st.lists(prefixes, max_size=12), query=st.lists(st.integers(0, 3), max_size=8))
    def test_longest_prefix_matches_brute_force(self, stored, query):
        """The lookup returns the longest stored prefix of the query, as a scan would."""
        cache = PrefixCache(max_bytes=10**9)
        for p in stored:
            cache.insert(p, tuple(p), nbytes=1)
        hit = cache.longest_prefix(query)
        candidates = [p for p in stored if tuple(query[: len(p)]) == tuple(p)]
        expected = max((len(p) for p in candidates), default=0)
        assert hit.length == expected
        assert hit.value == (tuple(query[:expected]) if expected else None)
        assert len(cache) == len({tuple(p) for p in stored})

    def test_a_token_that_is_not_an_integer_is_refused_and_changes_nothing(self):
        """A float or unhashable token is refused naming it, and leaves no branch behind; a
        numpy integer is its int (the trie was keyed by the token as given and recorded
        its int, so removing a 1.5 failed with KeyError, halfway through an eviction)."""
        cache = PrefixCache(max_bytes=100)
        cache.insert([1], "a", 1)
        for bad in ([1, 2.5], [1, 2, [3]], [0.5]):
            with pytest.raises(TypeError, match="tokens must be integers"):
                cache.insert(bad, "x", 1)
        assert len(cache) == 1 and cache.longest_prefix([1, 2, 3]).value == "a"
        assert cache._root.children.keys() == {1} and not cache._root.children[1].children
        cache.insert([1, np.int64(2)], "ab", 1)
        assert cache.longest_prefix([1, 2, 9]).value == "ab"
        cache.remove([1, 2])
        assert cache.longest_prefix([1, 2, 9]).value == "a"
        cache.clear()
        assert len(cache) == 0 and cache.nbytes == 0

    def test_max_length_limits_the_lookup(self):
        """max_length stops the lookup short of the full context."""
        cache = PrefixCache(max_bytes=100)
        cache.insert([1, 2, 3], "abc", 1)
        cache.insert([1], "a", 1)
        assert cache.longest_prefix([1, 2, 3], max_length=2).value == "a"
        assert cache.longest_prefix([1, 2, 3]).value == "abc"

    def test_eviction_is_lru_and_bounded_and_spares_pinned_entries(self):
        """Unpinned entries are evicted least recently used first; pinned ones stay."""
        cache = PrefixCache(max_bytes=30)
        cache.insert([1], "pinned", 10, pin=True)
        cache.insert([2], "b", 10)
        cache.insert([3], "c", 10)
        cache.longest_prefix([2, 9])  # touch [2]
        cache.insert([4], "d", 10)
        assert [1] in cache and [2] in cache and [4] in cache and [3] not in cache
        assert cache.nbytes <= 30
        cache.insert([5], "e", 10)
        cache.insert([6], "f", 10)
        assert [1] in cache and cache.nbytes <= 30
        cache.unpin([1])  # now evictable, as the most recently used entry
        cache.insert([7], "g", 10)
        assert [1] in cache
        cache.insert([8], "h", 10)
        cache.insert([9], "i", 10)
        assert [1] not in cache

    def test_is_pinned_follows_pins_and_unpins(self):
        """is_pinned is True exactly while a stored entry holds pins (counted)."""
        cache = PrefixCache(max_bytes=10)
        assert not cache.is_pinned([1])  # nothing stored
        cache.insert([1, 2], "x", 1)
        assert not cache.is_pinned([1, 2]) and not cache.is_pinned([1])
        cache.pin([1, 2])
        cache.pin([1, 2])
        assert cache.is_pinned([1, 2]) and not cache.is_pinned([1])
        cache.unpin([1, 2])
        assert cache.is_pinned([1, 2])
        cache.unpin([1, 2])
        assert not cache.is_pinned([1, 2]) and [1, 2] in cache

    @pytest.mark.parametrize(("nbytes", "error"), [(-1000, ValueError), ("5", TypeError)])
    def test_a_bad_size_is_refused_and_changes_nothing(self, nbytes, error):
        """A negative or non-integer size is refused by name before the trie changes (a
        negative one was counted, so later entries overran the budget; a string one left
        a node marked as an entry that nothing held)."""
        cache = PrefixCache(max_bytes=100)
        cache.insert([7], "kept", 10)
        with pytest.raises(error, match="nbytes"):
            cache.insert([7, 8], "bad", nbytes)
        assert len(cache) == 1 and cache.nbytes == 10 and [7, 8] not in cache
        hit = cache.longest_prefix([7, 8, 9])
        assert (hit.length, hit.value) == (1, "kept")
        with pytest.raises(error, match="nbytes"):
            cache._lru.add("key", "value", nbytes)
        with pytest.raises(error, match="nbytes"):
            cache._lru.add_many([("a", "value", 5), ("b", "value", nbytes)])
        assert cache.nbytes == 15 and cache._lru.get("b") is None  # "a" held, counted

    def test_pinning_errors_are_clear(self):
        """Pinning an absent prefix or over-unpinning raises KeyError."""
        cache = PrefixCache(max_bytes=10)
        with pytest.raises(KeyError):
            cache.pin([1])
        cache.insert([1], "x", 1)
        with pytest.raises(KeyError):
            cache.unpin([1])

    def test_remove_below_drops_exactly_the_entries_under_a_prefix(self):
        """remove_below((7,)) drops every entry whose key starts with 7, pinned or not, and
        nothing else (checked against the list of keys); the trie keeps no empty branch."""
        cache = PrefixCache(max_bytes=10**6)
        keys = [(7,), (7, 1), (7, 1, 2), (7, 2), (8,), (8, 7), (9, 7, 1), (1,)]
        for i, key in enumerate(keys):
            cache.insert(key, f"v{i}", 10 + i)
        cache.pin((7, 1, 2))
        cache.pin((8, 7))
        assert cache.remove_below((7,)) == 4
        kept = [k for k in keys if k[0] != 7]
        assert [k for k in keys if k in cache] == kept
        assert cache.nbytes == sum(10 + keys.index(k) for k in kept)
        assert 7 not in cache._root.children  # the emptied branch is pruned
        assert cache.remove_below((7,)) == 0 and cache.remove_below((2, 3)) == 0
        assert cache.remove_below(()) == len(kept) and len(cache) == 0 and cache.nbytes == 0

    def test_entry_larger_than_budget_is_refused(self):
        """insert returns False for an entry that cannot fit, and stores nothing."""
        cache = PrefixCache(max_bytes=5)
        assert cache.insert([1], "x", 6) is False
        assert len(cache) == 0 and cache.nbytes == 0

    def test_hundred_thousand_token_chain(self):
        """A 100,000-token chain is inserted, found, evicted and pruned without recursion."""
        limit = sys.getrecursionlimit()
        chain = list(range(100_000))
        cache = PrefixCache(max_bytes=100)
        cache.insert(chain, "long", 60)
        assert cache.longest_prefix(chain + [5]).length == 100_000
        cache.insert(chain[:10], "short", 30)
        cache.insert([7], "other", 20)  # evicts the least recently used: the long chain
        assert chain not in cache and cache.longest_prefix(chain).length == 10
        cache.remove(chain[:10])
        assert cache._root.children.keys() == {7}
        assert sys.getrecursionlimit() == limit

    def test_clear_keep_pinned(self):
        """clear(keep_pinned=True) drops only unpinned entries."""
        cache = PrefixCache(max_bytes=100)
        cache.insert([1, 2], "p", 1, pin=True)
        cache.insert([1, 3], "u", 1)
        cache.clear(keep_pinned=True)
        assert [1, 2] in cache and [1, 3] not in cache and len(cache) == 1
        cache.clear()
        assert len(cache) == 0 and cache.nbytes == 0
