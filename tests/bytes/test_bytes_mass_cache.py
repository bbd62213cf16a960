"""ByteLM's mass cache: its byte accounting equals the sum of the entries it holds.

Regression for issue 12 item 13: two concurrent misses of one context stored the entry
twice and counted it twice (63 KB counted, 0 held), after which the cache stayed empty.
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.bytes_lms import assert_steps_match_brute_force, run
from support.rolled import RolledLM

from genlm.bytes import BeamParams, ByteBeamState, ByteLM
from genlm.core import Vocabulary
from genlm.core import _trie as trie_module
from genlm.core.mock import MockLM

TOKENS = (b"</s>", b"a", b"b", b"ab", b"\n", b"\n\n")
VOCAB = Vocabulary(TOKENS, special_ids={0}, eos_token_ids=(0,))
CONTEXTS = [(1,), (1, 2), (2,), (2, 3), (3, 3, 1), (4, 1)]


def held_bytes(byte_lm: ByteLM) -> int:
    """What the held entries occupy, counted here from the memory their arrays keep alive
    (a view's whole base: core hands out rows as views of their batch, and the trie's
    outputs are views of a C block that may be larger than they are), not by the cache."""
    total = 0
    for key, entry in byte_lm.cache.items():
        owners = [owner(a) for a in (entry.lm_row, entry.logp, entry.mass)]
        total += sum({id(a): allocated(a) for a in owners}.values()) + key_bytes(key)
    return total


def owner(array: np.ndarray) -> object:
    """The object at the end of ``array``'s base chain: the memory it keeps alive."""
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array


def allocated(memory: object) -> int:
    """Bytes an owner holds: an array's, or a trie output block's allocation."""
    return memory.nbytes if isinstance(memory, np.ndarray) else memory.allocated


def key_bytes(key) -> int:
    """A key's objects as sys.getsizeof sees them, each token id counted as a 28-byte int
    (small ids are shared objects: core's rule counts them as a tokenizer's distinct ints)."""
    ctx, eos_mode = key
    return sum(map(sys.getsizeof, [key, ctx, eos_mode])) + sys.getsizeof(10**6) * len(ctx)


def test_concurrent_misses_are_held_and_counted_once():
    """Two concurrent misses of one context: one entry, counted once; the cache still works."""

    async def scenario():
        async with MockLM(VOCAB, max_wait_s=0.01) as lm:
            byte_lm = ByteLM(lm, eos=[b"</s>", b"\n\n"])
            first, second = await asyncio.gather(
                byte_lm.next_tokens([(1,)]), byte_lm.next_tokens([(1,)])
            )
            assert len(byte_lm.cache) == 1
            one_entry = held_bytes(byte_lm)
            assert byte_lm.cache.used_bytes == one_entry
            # Both callers got the entry the cache holds.
            assert first[0] is second[0] is byte_lm.cache.get(((1,), True))
            # A budget of two entries: concurrent misses of three contexts leave two held.
            small = ByteLM(lm, eos=[b"</s>", b"\n\n"], cache_bytes=2 * one_entry + 16)
            ctxs = [(2,), (3,), (4,)]
            await asyncio.gather(*(small.next_tokens(ctxs) for _ in range(3)))
            assert len(small.cache) == 2
            assert small.cache.used_bytes == held_bytes(small)
            # And later misses are still cached (the cache did not stay empty).
            await small.next_tokens([(1, 2)])
            assert ((1, 2), True) in small.cache

    run(scenario())


_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("get"),
            st.lists(st.sampled_from(CONTEXTS), min_size=1, max_size=3),
            st.booleans(),  # EOS mode
            st.integers(1, 3),  # concurrent copies of the call
        ),
        st.just(("clear",)),
    ),
    max_size=12,
)


@settings(max_examples=30, deadline=None)
@given(ops=_ops, budget_entries=st.integers(0, 4))
def test_accounting_equals_held_entries_after_any_operations(ops, budget_entries):
    """After any sequence of (concurrent) lookups and clears, the counted bytes are the
    held entries' bytes, within the budget."""

    async def scenario():
        async with MockLM(VOCAB, max_wait_s=0.001) as lm:
            probe = ByteLM(lm, eos=[b"</s>", b"\n\n"])
            await probe.next_tokens([(1,)])
            budget = budget_entries * held_bytes(probe)
            byte_lm = ByteLM(lm, eos=[b"</s>", b"\n\n"], cache_bytes=budget)
            for op in ops:
                if op[0] == "clear":
                    byte_lm.clear_cache()
                else:
                    _, contexts, eos_mode, copies = op
                    results = await asyncio.gather(
                        *(byte_lm.next_tokens(contexts, eos_mode) for _ in range(copies))
                    )
                    assert all(len(r) == len(contexts) for r in results)
                assert byte_lm.cache.used_bytes == held_bytes(byte_lm)
                assert byte_lm.cache.used_bytes <= budget

    run(scenario())


class _Float64BatchLM:
    """An LM whose float64 rows are views of a 64-row batch, as batched backends return."""

    vocab = VOCAB

    async def next_token_logprobs(self, token_ids):
        batch = np.log(np.full((64, len(VOCAB)), 1.0 / len(VOCAB)))
        return batch[0]


def test_cached_masses_are_read_only_and_own_their_memory():
    """What the cache shares is read-only (the 0.2 API's ``LazyTrieState.mass`` too), and
    a float64 row's text log-probabilities do not keep the LM's batch alive: the held
    memory is what the cache counts."""

    async def scenario():
        byte_lm = ByteLM(_Float64BatchLM(), K=None, eos=[])  # no EOS id: nothing masked
        (nxt,) = await byte_lm.next_tokens([(1,)])
        for array in (nxt.logp, nxt.mass):
            assert not array.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            nxt.mass[0] = 0.0
        assert nxt.logp.base is None  # a copy of the row view, not the view
        assert held_bytes(byte_lm) == byte_lm.cache.used_bytes

    run(scenario())


@pytest.mark.skipif(trie_module._trie_kernel is None, reason="the C module was not built")
def test_a_mass_in_a_larger_pooled_block_is_counted_as_held():
    """A trie output lives in a pooled C block that may be up to twice its size (left by
    another caller, e.g. a batched call on the same trie): the mass the cache keeps holds
    no more memory than the cache counts (issue: 1.56x its cache_bytes held)."""
    tokens = [bytes([a, b, *tail]) for tail in ((), (7,)) for a in range(256) for b in range(256)]
    vocab = Vocabulary([b"</s>", *tokens], special_ids={0}, eos_token_ids=(0,))

    async def scenario():
        async with MockLM(vocab) as lm:
            byte_lm = ByteLM(lm, K=None)
            mass_bytes = 8 * byte_lm.trie.num_nodes
            assert mass_bytes >= 2**20  # pooled: the smallest pooled output is 1 MiB
            previous = trie_module.set_trie_pool_limit(0)  # empty the pool, then refill it
            trie_module.set_trie_pool_limit(1 << 30)
            try:
                del_at_once = trie_module._trie_kernel.empty(mass_bytes * 3 // 2)
                del del_at_once  # the next mass takes this block, half again its size
                (nxt,) = await byte_lm.next_tokens([(1,)])
            finally:
                trie_module.set_trie_pool_limit(previous)
            assert allocated(owner(nxt.mass)) == nxt.mass.nbytes == mass_bytes
            assert byte_lm.cache.used_bytes == held_bytes(byte_lm)

    run(scenario())


def test_the_seed_apis_masses_cannot_be_changed_in_place():
    """Editing ``LazyTrieState.mass`` in place raises, and the same bytes prefilled again
    on the same model give the same log-probability."""

    async def scenario():
        vocab = Vocabulary((b"<s>", *TOKENS), special_ids={0, 1}, bos_token_id=0)
        async with MockLM(vocab) as lm:
            beam = await (await ByteBeamState.initial(lm, BeamParams(K=4))).prefill(b"ab")
            state = next(iter(beam))
            with pytest.raises(ValueError, match="read-only"):
                state.mass[state.node] = 0.0
            fresh = await (await ByteBeamState.initial(lm, BeamParams(K=4))).prefill(b"ab")
            assert fresh.logZ == beam.logZ

    run(scenario())


class _BufferLM:
    """An LM that fills one float64 buffer on each call and returns it (an allocation-free
    backend): what the byte LM keeps must be its own copy, and the buffer must stay
    writeable. A buffer found read-only is counted in ``frozen`` and replaced, so the
    numbers are checked on their own."""

    def __init__(self, lm: MockLM):
        self.lm, self.vocab = lm, lm.vocab
        self.buffer = np.empty(len(lm.vocab))
        self.frozen = 0

    async def next_token_logprobs(self, token_ids):
        if not self.buffer.flags.writeable:
            self.frozen += 1
            self.buffer = np.empty(len(self.vocab))
        self.buffer[:] = self.lm.next_token_logprobs_sync(token_ids)
        return self.buffer

    def next_token_logprobs_sync(self, token_ids):
        """A fresh row, for the brute force."""
        return np.asarray(self.lm.next_token_logprobs_sync(token_ids), dtype=np.float64)


@pytest.mark.parametrize("eos", [[], [b"\n\n"]], ids=["nothing_masked", "text_eos"])
def test_a_row_the_lm_fills_again_is_copied_not_frozen(eos):
    """Over an LM that refills one buffer per call, every state's next-symbol distribution
    equals brute force, and the buffer is never made read-only (ByteLM kept the buffer
    itself: it read its log-probabilities, or recomputed masses from it, after the LM had
    refilled it with a later row, and it made the buffer read-only when nothing was
    masked)."""
    tokens = (b"\n", b"\n\n", b"a", b"\n\na")  # no BOS: every id is text or EOS
    context, data, prompt = (2,), b"a\n\na\n\n\na", 4

    async def scenario():
        async with MockLM(Vocabulary(tokens), seed=5) as mock:
            lm = _BufferLM(mock)
            byte_lm = ByteLM(lm, K=None, eos=eos)
            await assert_steps_match_brute_force(lm, byte_lm, context, data, prompt)
            assert lm.frozen == 0 and lm.buffer.flags.writeable
            for _, entry in byte_lm.cache.items():
                assert entry.lm_row is not lm.buffer and not entry.lm_row.flags.writeable

    run(scenario())


def test_a_read_only_row_of_its_own_is_kept_without_a_copy():
    """A read-only float64 row holding only its own memory (core's rows, once compacted) is
    kept as it is, and is the text log-probabilities when nothing is masked: no copy."""
    row = np.log(np.full(len(VOCAB), 1.0 / len(VOCAB)))
    row.setflags(write=False)

    class ReadOnlyLM:
        vocab = VOCAB

        async def next_token_logprobs(self, token_ids):
            return row

    async def scenario():
        (nxt,) = await ByteLM(ReadOnlyLM(), K=None, eos=[]).next_tokens([(1,)])
        assert nxt.lm_row is row and nxt.logp is row

    run(scenario())


def test_clear_cache_keeps_out_the_masses_of_a_step_waiting_for_the_lm():
    """A step waits for the LM's row; the LM changes and both caches are cleared; the
    step's masses are not stored, so a later state of the same context equals a fresh
    ByteLM over the changed LM (they were stored, from the row of the LM as it was)."""
    import threading

    vocab = [bytes([i]) for i in range(256)]

    class HeldLM(MockLM):
        def __init__(self):
            super().__init__(vocab, seed=0)
            self.gate, self.started = threading.Event(), threading.Event()

        def _logprobs_batch(self, contexts, variant):
            out = super()._logprobs_batch(contexts, variant)  # the weights of now
            self.started.set()
            assert self.gate.wait(10)
            return out

    async def distribution(byte_lm):
        state = await byte_lm.initial([65])
        return np.exp((await state.logp_next()).logprobs)

    async def scenario():
        lm = HeldLM()
        byte_lm = ByteLM(lm, K=None, close_lm=True)
        step = asyncio.ensure_future(distribution(byte_lm))
        for _ in range(5000):  # until the LM computes the row of [65] (at most 5 s)
            if lm.started.is_set():
                break
            await asyncio.sleep(0.001)
        assert lm.started.is_set()
        lm.seed = 1  # the LM changes ...
        clearing = asyncio.get_running_loop().run_in_executor(None, lm.clear_cache)
        byte_lm.clear_cache()  # ... and both caches are cleared
        lm.gate.set()
        await asyncio.wait_for(asyncio.gather(clearing, step), 10)
        after = await asyncio.wait_for(distribution(byte_lm), 10)
        await byte_lm.aclose()
        async with ByteLM(MockLM(vocab, seed=1), K=None, close_lm=True) as fresh:
            return after, await distribution(fresh)

    after, expected = run(scenario())
    np.testing.assert_allclose(after, expected, rtol=1e-9, atol=1e-12)


def test_masses_follow_the_token_lms_adapter():
    """The cache kept the masses of the adapter active when they were computed: after
    ``clear_lora`` a ByteLM made before served the adapter's next-byte distribution (a
    fresh ByteLM the base model's). Each distribution now equals a fresh ByteLM's under
    the same adapter, and a state made under the adapter, switched to text mode after
    ``clear_lora``, keeps its own row's masses without caching them for the base model."""
    vocab = [bytes([b]) for b in range(97, 112)]

    async def dist(byte_lm, prompt=(0,)):
        state = await byte_lm.initial(list(prompt))
        return (await state.logp_next()).logprobs

    async def scenario():
        async with RolledLM(vocab) as lm:
            lm.add_lora(5, "rolled")
            reused = ByteLM(lm, K=None)
            base = await dist(reused)
            lm.set_lora("rolled")
            rolled = await dist(reused)
            np.testing.assert_allclose(rolled, await dist(ByteLM(lm, K=None)), atol=1e-9)
            assert not np.allclose(rolled, base)
            state = await (await reused.initial([0])).advance(ord("b"))  # inside a token
            lm.clear_lora()
            text_mode = await state.with_eos_mode(False)
            inside = [c for c in text_mode.candidates if c.next is not None]
            assert inside and all(c.next.variant == "rolled" for c in inside)
            np.testing.assert_allclose(await dist(reused), base, atol=1e-9)
            np.testing.assert_allclose(
                await dist(reused, (0, 1)), await dist(ByteLM(lm, K=None), (0, 1)), atol=1e-9
            )

    run(scenario())
