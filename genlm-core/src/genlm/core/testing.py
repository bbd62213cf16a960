"""The backend conformance kit: a reusable pytest suite for any ``AsyncLM``.

A backend author subclasses :class:`AsyncLMConformance` in a test module and overrides
one fixture, ``lm`` (a class-scoped fixture, so a ``classmethod``: pytest 9 deprecates
class-scoped fixtures defined as instance methods)::

    import pytest
    from genlm.core.testing import AsyncLMConformance

    class TestMyBackend(AsyncLMConformance):
        @pytest.fixture(scope="class")
        @classmethod
        def lm(cls):
            model = MyLM.from_name("stories260K")
            yield model
            model.close()

        @pytest.fixture(scope="class")
        @classmethod
        def make_lm(cls):
            return lambda: MyLM.from_name("stories260K")

The close checks need a model each, since a closed model serves nothing more: they skip
unless the subclass also overrides ``make_lm``, a class-scoped fixture returning a callable
that makes a new model (opt-in, so a subclass written before them runs as it did). Each
check makes one, closes it and leaves it closed before the next makes another, so an engine
that allows one instance at a time (vLLM's in-process engine) serves too, as long as the
``lm`` fixture's model is not open meanwhile: run the close checks in a process of their
own, with ``lm`` overridden to skip, as genlm's vllm tests do. They check that ``close()``
(where the model has one) and ``aclose()`` (``async with``) finish, more than once and from
two threads at once; that closing while requests are in flight, some with the backend, some
queued, some sync calls on other threads, ends each of them with its result or
``ModelClosedError``, none left pending; and that every request method of a closed model
raises ``ModelClosedError`` while ``clear_cache()`` does nothing. Each step runs on a thread
of its own and fails its check as hung after :attr:`AsyncLMConformance.close_timeout_s`
seconds (60), so no close check can hang the test run.

Every check runs its coroutines with ``asyncio.run``, one event loop per check, so the
suite also proves the model survives successive event loops. Tolerances are class
attributes, so a backend with batch-dependent kernels can loosen ``atol`` explicitly.

The contexts are made to catch what state reuse and padding get wrong: their lengths are
out of order, two are of equal length, one extends an earlier context and one is a prefix
of an earlier context (a KV cache resumes or crops them), all within the model's
``max_context_length``; one check also batches more distinct contexts than an engine's
small per-batch buffers hold (:attr:`AsyncLMConformance.large_batch`), and one computes
a long context (:attr:`AsyncLMConformance.long_context`, 40 tokens) after a prefix and a
sibling of it, so that a paged KV cache resumes it from cached prefixes longer than one of
its 16-token blocks. Rows computed one after the other, each after whatever state the
previous ones left, must equal rows computed from a cleared model, and a row the caller
holds must not change when later rows are computed. One check calls the sync twins from
other threads while async requests are in flight on the event loop: every row must be the
row sequential calls get (a backend whose sync twins run its engine on the caller's thread,
beside its worker, races).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import TypeVar

import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import binom

from genlm.core._close_checks import (
    InFlight,
    InThread,
    aclose_call,
    assert_resolved,
    describe_outcome,
    has_close,
    make_requests,
    outcome_of,
    rows_problem,
    settle,
    sync_on_a_thread,
    tokens_problem,
)
from genlm.core._errors import InvalidContextError, ModelClosedError
from genlm.core._protocol import AsyncLM
from genlm.core.cli import encode_text

__all__ = ["AsyncLMConformance"]

#: The seed of the close checks' contexts and of their seeded sample.
_CLOSE_SEED = 97531

T = TypeVar("T")


class AsyncLMConformance:
    """Checks every ``AsyncLM`` must pass. Override the ``lm`` fixture."""

    #: Largest allowed difference between two computations of the same log-probabilities.
    atol: float = 1e-4
    #: Largest allowed ``|logsumexp(row)|``.
    normalization_tol: float = 1e-4
    #: First tokens drawn per way of sampling by the checks of the sampled distribution.
    sample_draws: int = 200
    #: Distinct contexts in the large batch of :meth:`test_large_batch_equals_single`
    #: (fewer where the model's ``max_batch_size`` is smaller), more than an engine's
    #: small per-batch buffers (often 8 slots) hold.
    large_batch: int = 32
    #: Tokens in the long context of :meth:`test_long_context_reuse_equals_fresh`, its
    #: BOS token included (fewer where the model's ``max_context_length`` is shorter):
    #: more than two of a paged KV cache's 16-token blocks (vLLM's default size), so that
    #: it resumes from a cached prefix of whole blocks.
    long_context: int = 40
    #: Seconds each step of a close check (a close, a call on the closed model, the
    #: requests in flight at a close) may take before the check fails it as hung; raise it
    #: for an engine whose batches or release take longer.
    close_timeout_s: float = 60.0

    @pytest.fixture(scope="class")
    @classmethod
    def lm(cls) -> AsyncLM:
        """The model under test (override this)."""
        pytest.fail("override the `lm` fixture in your AsyncLMConformance subclass")

    @pytest.fixture(scope="class")
    @classmethod
    def make_lm(cls) -> Callable[[], AsyncLM]:
        """Makes the close checks' models (override this to run them; they skip
        otherwise): a callable without arguments that returns a new open model, as ``lm``
        would be. Each close check makes one and closes it before the next is made, so an
        engine that allows one instance at a time (vLLM's in-process engine) serves too,
        provided ``lm``'s is not open meanwhile."""
        pytest.skip(
            "the close checks need a new model each: override the `make_lm` fixture to "
            "run them (see genlm.core.testing)"
        )

    @pytest.fixture(scope="class")
    @classmethod
    def contexts(cls, lm: AsyncLM) -> list[list[int]]:
        """A few distinct valid contexts (override to choose them; see the module): random
        bodies of 5, 2 and 8 tokens, the 2-token one extended by a token, one more of that
        length, and the 8-token one's first 4 tokens, after the BOS token if the model has
        one and its ``max_context_length`` leaves room for a token after it; lengths are
        capped at ``max_context_length`` (duplicates the cap makes are dropped)."""
        rng = np.random.default_rng(1234)
        start, room = _start_and_room(lm, 8)
        text_ids = np.asarray(lm.vocab.text_ids)

        def body(length: int) -> list[int]:
            return [int(t) for t in rng.choice(text_ids, size=min(length, room))]

        five, two, eight = body(5), body(2), body(8)
        bodies = [five, two, eight, (two + body(1))[:room], body(3), eight[:4]]
        out: list[list[int]] = []
        for b in bodies:
            if start + b not in out:
                out.append(start + b)
        return out

    @pytest.fixture(scope="class")
    @classmethod
    def many_contexts(cls, lm: AsyncLM) -> list[list[int]]:
        """:attr:`large_batch` plus 3 distinct valid contexts, or ``max_batch_size`` plus 3
        where the model batches fewer (a full batch and a partial one): random bodies of 1
        to 8 tokens, after the BOS token as in ``contexts``. Skips the checks that use it
        where ``max_context_length`` leaves fewer distinct contexts."""
        batcher = getattr(lm, "batcher", None)  # a BatchedLM's scheduler
        size = min(cls.large_batch, getattr(batcher, "max_batch_size", cls.large_batch))
        wanted = size + 3
        out = _distinct_contexts(lm, wanted, seed=4321)
        if len(out) < wanted:
            pytest.skip(
                f"found {len(out)} distinct contexts within the model's max_context_length, "
                f"not the {wanted} a large batch needs"
            )
        return out

    @pytest.fixture(scope="class")
    @classmethod
    def long_contexts(cls, lm: AsyncLM) -> list[list[int]]:
        """A long context and its relatives, in the order
        :meth:`test_long_context_reuse_equals_fresh` computes them (override to choose
        them): of :attr:`long_context` tokens (40) in all, a prefix of 34 tokens, a sibling
        of 40 that shares its first 36, the long context itself, it extended by 3 tokens,
        and its prefixes of 32 and 20 tokens (these lengths scaled to a shorter long
        context). Random tokens after the BOS token as in ``contexts``; the extended
        context is capped at ``max_context_length``, and the check skips where the limit
        leaves no context longer than ``contexts``' longest (9 tokens)."""
        rng = np.random.default_rng(2468)
        start, room = _start_and_room(lm, cls.long_context + 3)
        length = min(cls.long_context + 3, len(start) + room) - 3  # the long context's
        if length <= 9:
            pytest.skip(
                f"the model's max_context_length ({_limit(lm)}) leaves no context longer "
                f"than the 9 tokens of the kit's other contexts"
            )
        text_ids = np.asarray(lm.vocab.text_ids)
        full = start + [int(t) for t in rng.choice(text_ids, size=length + 3 - len(start))]
        long = full[:length]
        share = max(len(start), length * 9 // 10)  # the sibling's tokens from the long one
        others = text_ids[text_ids != long[share]]  # its next token differs
        others = others if len(others) else text_ids
        sibling = long[:share] + [int(t) for t in rng.choice(others, size=1)]
        sibling += [int(t) for t in rng.choice(text_ids, size=length - len(sibling))]
        prefixes = [long[: length * 17 // 20], long[: length * 4 // 5], long[: length // 2]]
        out: list[list[int]] = []
        for context in [prefixes[0], sibling, long, full, *prefixes[1:]]:
            if context and context not in out:  # drops what a short limit makes equal
                out.append(context)
        return out

    @pytest.fixture(scope="class")
    @classmethod
    def prompt(cls, contexts: list[list[int]]) -> list[int]:
        """The shortest context: the sampling checks' prompt."""
        return min(contexts, key=len)

    # ---- shape and numerics ------------------------------------------------------

    def test_is_async_lm(self, lm):
        """The model satisfies the runtime-checkable AsyncLM protocol."""
        assert isinstance(lm, AsyncLM)
        assert len(lm.byte_vocab) == len(lm.vocab)

    def test_shape_and_dtype(self, lm, contexts):
        """A next-token row is float32 with one entry per vocabulary token."""
        row = asyncio.run(lm.next_token_logprobs(contexts[0]))
        assert isinstance(row, np.ndarray)
        assert row.dtype == np.float32
        assert row.shape == (len(lm.vocab),)

    def test_normalized(self, lm, contexts):
        """Every row is a normalized log-distribution without NaN or +inf."""
        rows = asyncio.run(lm.batch_next_token_logprobs(contexts))
        assert not np.isnan(rows).any() and not np.isposinf(rows).any()
        totals = logsumexp(rows.astype(np.float64), axis=1)
        np.testing.assert_allclose(totals, 0.0, atol=self.normalization_tol)

    def test_batch_equals_single(self, lm, contexts):
        """A batched call returns the rows that single calls return."""
        lm.clear_cache()
        batch = asyncio.run(lm.batch_next_token_logprobs(contexts))
        assert batch.shape == (len(contexts), len(lm.vocab))
        for context, row in zip(contexts, batch):
            lm.clear_cache()
            single = asyncio.run(lm.next_token_logprobs(context))
            np.testing.assert_allclose(row, single, atol=self.atol)

    def test_large_batch_equals_single(self, lm, many_contexts):
        """A batch of more distinct contexts than small buffers hold (see
        :attr:`large_batch`), a full batch and a partial one where the model batches fewer,
        returns the rows each context gets alone (by the sync twin: one event loop per
        context would cost more than the batch)."""
        lm.clear_cache()
        batch = asyncio.run(lm.batch_next_token_logprobs(many_contexts))
        assert batch.shape == (len(many_contexts), len(lm.vocab))
        for i, (context, row) in enumerate(zip(many_contexts, batch)):
            lm.clear_cache()
            single = lm.next_token_logprobs_sync(context)
            np.testing.assert_allclose(row, single, atol=self.atol, err_msg=f"row {i}: {context}")

    def test_async_equals_sync(self, lm, contexts):
        """The sync twins return what the async methods return."""
        lm.clear_cache()
        async_rows = asyncio.run(lm.batch_next_token_logprobs(contexts))
        lm.clear_cache()
        sync_rows = lm.batch_next_token_logprobs_sync(contexts)
        np.testing.assert_allclose(async_rows, sync_rows, atol=self.atol)
        lm.clear_cache()
        np.testing.assert_allclose(
            lm.next_token_logprobs_sync(contexts[-1]), async_rows[-1], atol=self.atol
        )

    def test_concurrent_equals_sequential(self, lm, contexts):
        """Many concurrent requests, duplicates included, get the rows sequential calls get."""
        requests = contexts * 3
        lm.clear_cache()

        async def concurrent():
            return await asyncio.gather(*(lm.next_token_logprobs(c) for c in requests))

        together = asyncio.run(concurrent())
        for context, row in zip(requests, together):
            lm.clear_cache()
            np.testing.assert_allclose(
                row, asyncio.run(lm.next_token_logprobs(context)), atol=self.atol
            )

    def test_cache_hit_equals_miss(self, lm, contexts):
        """A repeated request returns what the first one computed: exactly where the model's
        output cache served it (a hit), within ``atol`` where it was recomputed (no cache,
        or a budget too small for the row)."""
        _need(contexts, 3)
        cache = getattr(lm, "output_cache", None)
        lm.clear_cache()
        first = np.array(asyncio.run(lm.next_token_logprobs(contexts[2])))
        hits = getattr(cache, "hits", 0)
        again = asyncio.run(lm.next_token_logprobs(contexts[2]))
        if getattr(cache, "hits", 0) > hits:
            np.testing.assert_array_equal(first, again)
        else:
            np.testing.assert_allclose(again, first, atol=self.atol)
        lm.clear_cache()
        np.testing.assert_allclose(
            asyncio.run(lm.next_token_logprobs(contexts[2])), first, atol=self.atol
        )

    def test_reused_state_equals_fresh(self, lm, contexts):
        """Rows computed one after another, each after the state the previous calls left
        (KV or other caches resumed, extended, cropped), equal rows from a cleared model."""
        fresh = []
        for context in contexts:
            lm.clear_cache()
            fresh.append(np.array(asyncio.run(lm.next_token_logprobs(context))))
        lm.clear_cache()
        for context, expected in zip(contexts, fresh):
            row = asyncio.run(lm.next_token_logprobs(context))
            np.testing.assert_allclose(row, expected, atol=self.atol, err_msg=str(context))

    def test_long_context_reuse_equals_fresh(self, lm, long_contexts):
        """A long context computed after a prefix and a sibling of it, and its extension
        and prefixes after it (a KV cache resumed from cached prefixes longer than one
        16-token block, extended, cropped; see ``long_contexts``), get the rows of a
        cleared model: one after another, and together in one batch after the first."""
        fresh = []
        for context in long_contexts:
            lm.clear_cache()
            fresh.append(np.array(lm.next_token_logprobs_sync(context)))
        lm.clear_cache()
        for i, (context, expected) in enumerate(zip(long_contexts, fresh)):
            row = asyncio.run(lm.next_token_logprobs(context))
            np.testing.assert_allclose(
                row, expected, atol=self.atol, err_msg=_after(long_contexts[:i], context)
            )
        lm.clear_cache()
        asyncio.run(lm.next_token_logprobs(long_contexts[0]))
        batch = asyncio.run(lm.batch_next_token_logprobs(long_contexts[1:]))
        for context, row, expected in zip(long_contexts[1:], batch, fresh[1:]):
            np.testing.assert_allclose(
                row,
                expected,
                atol=self.atol,
                err_msg="in one batch, " + _after(long_contexts[:1], context),
            )

    def test_held_rows_do_not_change(self, lm, contexts):
        """A row the caller holds stays what it was while later rows are computed (a backend
        that reuses an output buffer must say so: see ``BatchedLM.stable_batches``)."""
        _need(contexts, 2)
        lm.clear_cache()
        held = asyncio.run(lm.next_token_logprobs(contexts[0]))
        copy = np.array(held)
        asyncio.run(lm.batch_next_token_logprobs(contexts[1:]))
        lm.next_token_logprobs_sync(contexts[-1])
        np.testing.assert_array_equal(held, copy)

    # ---- bad input -------------------------------------------------------------------

    @pytest.mark.parametrize(
        "bad",
        [[], [-1], ["oops"], [1.5], [None], "text", b"bytes"],
        ids=["empty", "negative", "string-id", "float-id", "none-id", "str", "bytes"],
    )
    def test_bad_context_raises_clear_error(self, lm, bad):
        """Empty contexts, non-integer ids and raw text raise InvalidContextError at once."""
        with pytest.raises(InvalidContextError):
            asyncio.run(lm.next_token_logprobs(bad))
        with pytest.raises(InvalidContextError):
            lm.next_token_logprobs_sync(bad)

    def test_out_of_range_id_names_the_id(self, lm):
        """An id past the vocabulary raises an error that names it (after a valid id, where
        ``max_context_length`` allows two tokens)."""
        bad = len(lm.vocab)
        context = [0, bad] if _limit(lm) != 1 else [bad]
        with pytest.raises(InvalidContextError, match=str(bad)):
            asyncio.run(lm.next_token_logprobs(context))

    def test_bad_request_does_not_poison_others(self, lm, contexts):
        """A failing request among concurrent good ones fails alone."""
        _need(contexts, 2)
        lm.clear_cache()

        async def mixed():
            return await asyncio.gather(
                lm.next_token_logprobs(contexts[0]),
                lm.next_token_logprobs([len(lm.vocab) + 5]),
                lm.next_token_logprobs(contexts[1]),
                return_exceptions=True,
            )

        first, failure, second = asyncio.run(mixed())
        assert isinstance(failure, InvalidContextError), (
            f"the request for an id past the vocabulary gave {failure!r}, "
            f"not an InvalidContextError"
        )
        for context, result in ((contexts[0], first), (contexts[1], second)):
            if isinstance(result, BaseException):
                pytest.fail(
                    f"the good request {context}, made together with a bad one, failed: {result!r}"
                )
        lm.clear_cache()
        np.testing.assert_allclose(first, lm.next_token_logprobs_sync(contexts[0]), atol=self.atol)
        np.testing.assert_allclose(second, lm.next_token_logprobs_sync(contexts[1]), atol=self.atol)

    # ---- sampling --------------------------------------------------------------------

    @staticmethod
    def _room(lm: AsyncLM, prompt: list[int], wanted: int) -> int:
        """``wanted`` tokens, or fewer where the model's context limit stops a sample
        (the last token is drawn from a context of exactly the limit)."""
        limit = _limit(lm)
        return wanted if limit is None else max(0, min(wanted, limit + 1 - len(prompt)))

    def test_sample_honours_max_tokens(self, lm, prompt):
        """A sample never exceeds max_tokens, and max_tokens=0 gives nothing."""
        n = self._room(lm, prompt, 4)
        out = asyncio.run(lm.sample(prompt, max_tokens=4, eos_token_ids=[], seed=0))
        assert len(out) == n
        assert all(0 <= t < len(lm.vocab) for t in out)
        assert asyncio.run(lm.sample(prompt, max_tokens=0, eos_token_ids=[], seed=0)) == []

    def test_sample_stops_at_eos(self, lm, prompt):
        """A sample ends with the first EOS token it draws."""
        everything = list(range(len(lm.vocab)))
        out = asyncio.run(lm.sample(prompt, max_tokens=5, eos_token_ids=everything, seed=0))
        assert len(out) == 1
        greedy = asyncio.run(lm.sample(prompt, max_tokens=6, eos_token_ids=[], temperature=0))
        assert len(greedy) == self._room(lm, prompt, 6)
        eos = [greedy[min(2, len(greedy) - 1)]]
        stopped = asyncio.run(lm.sample(prompt, max_tokens=6, eos_token_ids=eos, temperature=0))
        assert stopped == greedy[: greedy.index(eos[0]) + 1]

    def test_sample_is_seeded(self, lm, contexts, prompt):
        """The same seed gives the same tokens; batch_sample returns one list per prompt."""
        a = asyncio.run(lm.sample(prompt, max_tokens=6, eos_token_ids=[], seed=7))
        b = asyncio.run(lm.sample(prompt, max_tokens=6, eos_token_ids=[], seed=7))
        assert a == b
        prompts = sorted(contexts, key=len)[:3]
        batch = asyncio.run(lm.batch_sample(prompts, max_tokens=3, eos_token_ids=[], seed=11))
        again = asyncio.run(lm.batch_sample(prompts, max_tokens=3, eos_token_ids=[], seed=11))
        assert batch == again
        assert [len(s) for s in batch] == [self._room(lm, p, 3) for p in prompts]

    def test_greedy_sample_follows_argmax(self, lm, prompt):
        """temperature=0 picks the most likely token at every step."""
        out = asyncio.run(lm.sample(prompt, max_tokens=3, eos_token_ids=[], temperature=0))
        context = list(prompt)
        for token in out:
            row = lm.next_token_logprobs_sync(context)
            assert row[token] >= row.max() - self.atol
            context.append(token)

    def test_batch_sample_keeps_prompt_order(self, lm, contexts):
        """``batch_sample``'s continuation ``i`` is prompt ``i``'s: greedy, each of its tokens
        is the most likely after prompt ``i`` and the tokens before it (within ``atol``, so
        a near tie may go either way in a batch)."""
        prompts = sorted(contexts, key=len)[:4]
        together = asyncio.run(
            lm.batch_sample(prompts, max_tokens=3, eos_token_ids=[], temperature=0)
        )
        assert len(together) == len(prompts)
        for prompt, tokens in zip(prompts, together):
            assert len(tokens) == self._room(lm, prompt, 3), (prompt, tokens)
            context = list(prompt)
            for token in tokens:
                row = lm.next_token_logprobs_sync(context)
                assert row[token] >= row.max() - self.atol, (prompt, tokens)
                context.append(token)

    @pytest.mark.parametrize("temperature", [0.5, 2.0])
    def test_draws_follow_the_tempered_row(self, lm, prompt, temperature):
        """First tokens drawn at ``temperature`` follow ``softmax(row / temperature)``: by
        ``sample`` and by ``batch_sample``, seeded and unseeded (a backend's own sampler).

        Two events are counted over :attr:`sample_draws` draws each, the most likely token
        and the most likely tokens that hold half the mass, and each count must not lie in
        either tail of its binomial distribution beyond :data:`_TAIL` (a correct sampler
        fails a kit run at most once in 10^7)."""
        n = self.sample_draws
        kw = {"max_tokens": 1, "eos_token_ids": [], "temperature": temperature}

        async def draws():
            seeded = await asyncio.gather(*(lm.sample(prompt, seed=s, **kw) for s in range(n)))
            unseeded = await asyncio.gather(*(lm.sample(prompt, **kw) for _ in range(n)))
            batch = await lm.batch_sample([prompt] * n, seed=1, **kw)
            batch_unseeded = await lm.batch_sample([prompt] * n, **kw)
            return seeded, unseeded, batch, batch_unseeded

        row = np.asarray(lm.next_token_logprobs_sync(prompt), dtype=np.float64)
        names = ["sample, seeded", "sample, unseeded", "batch_sample", "batch_sample, unseeded"]
        for name, drawn in zip(names, asyncio.run(draws())):
            assert all(len(d) == 1 for d in drawn), f"{name}: not one token per draw"
            _assert_draws_follow(np.array([d[0] for d in drawn]), row, temperature, name)

    def test_seeds_change_the_draws(self, lm, prompt):
        """Two seeds give two different runs of ``batch_sample`` over the same prompt (one
        seed stream per prompt, each seed its own streams)."""
        row = np.asarray(lm.next_token_logprobs_sync(prompt), dtype=np.float64)
        n = self.sample_draws
        collision = float(np.exp(2 * row).sum())  # chance two draws agree
        if n * math.log(max(collision, 1e-300)) > math.log(1e-12):
            pytest.skip("the prompt's row is too peaked for two runs to differ surely")
        kw = {"max_tokens": 1, "eos_token_ids": [], "temperature": 1.0}
        one = asyncio.run(lm.batch_sample([prompt] * n, seed=1, **kw))
        two = asyncio.run(lm.batch_sample([prompt] * n, seed=2, **kw))
        assert one != two

    def test_default_eos_is_the_vocabularys(self, lm, prompt):
        """``eos_token_ids=None`` stops at the vocabulary's EOS ids: the same seeds draw what
        they draw with those ids named (checked where a draw meets one)."""
        eos = list(lm.vocab.eos_token_ids)
        if not eos:
            pytest.skip("the vocabulary has no EOS token")
        n = self._room(lm, prompt, 8)

        async def runs(eos_ids):
            samples = [lm.sample(prompt, n, eos_ids, temperature=1.5, seed=s) for s in range(20)]
            batch = lm.batch_sample([prompt] * 20, n, eos_ids, temperature=1.5, seed=5)
            *singles, together = await asyncio.gather(*samples, batch)  # each one awaited
            return [*singles, *together]

        default, named = asyncio.run(runs(None)), asyncio.run(runs(eos))
        assert default == named
        for tokens in default:
            assert not set(tokens[:-1]) & set(eos), f"drew on past EOS: {tokens}"

    def test_vocabulary_spells_the_tokenizers_ids(self, lm):
        """Where the model has a tokenizer, the vocabulary's bytes of the ids it encodes a
        text to are that text (a sentencepiece tokenizer may add a leading space): byte-level
        models and ``forbid_bytes`` read tokens from the vocabulary alone."""
        if lm.tokenizer is None:
            pytest.skip("the model has no tokenizer")
        for text in ("Once upon a time, there was a cat named Tom.", "It is 42 today!"):
            ids = encode_text(lm.tokenizer, text)
            if ids[:1] == [lm.vocab.bos_token_id]:
                ids = ids[1:]
            spelled = lm.vocab.decode(ids)
            assert spelled in (text.encode(), b" " + text.encode()), (text, ids, spelled)

    # ---- threads -------------------------------------------------------------------

    def test_sync_calls_from_threads_during_async_requests(self, lm, contexts, many_contexts):
        """Sync calls from two other threads, single and batched, made while async requests
        are in flight on the event loop, and those requests get the rows computed before,
        with no call made concurrently (in one sync batch: batched rows equal single ones
        by :meth:`test_large_batch_equals_single`). A backend whose sync twins run its
        engine on the caller's thread, beside the worker that serves the async requests,
        races or fails. Each thread calls until the async requests are done (at most
        :data:`_THREAD_PASSES` passes over its contexts); a call that hangs fails the check
        after :data:`_THREAD_TIMEOUT_S` seconds."""
        on_loop = contexts + many_contexts[0::2]  # each thread: singles of one part,
        parts = [many_contexts[1::4], many_contexts[3::4]]  # a batch of the other
        distinct = list(map(list, dict.fromkeys(map(tuple, contexts + many_contexts))))
        lm.clear_cache()
        reference = lm.batch_next_token_logprobs_sync(distinct)
        expected = {tuple(c): np.array(row) for c, row in zip(distinct, reference)}
        lm.clear_cache()
        go, done = threading.Event(), threading.Event()
        checked, wrong = [0, 0], [0, 0]  # rows checked, and rows wrong, per thread
        first_wrong: list[tuple[str, list[int], np.ndarray]] = []
        errors: list[BaseException] = []

        def check(k: int, how: str, context: list[int], row: np.ndarray) -> None:
            checked[k] += 1
            if not np.allclose(row, expected[tuple(context)], rtol=1e-7, atol=self.atol):
                wrong[k] += 1
                first_wrong.append((how, context, np.array(row)))
                del first_wrong[1:]

        def calls(k: int, singles: list[list[int]], batch: list[list[int]]) -> None:
            try:
                go.wait(_THREAD_TIMEOUT_S)
                for _ in range(_THREAD_PASSES):
                    for context in singles:
                        check(k, "sync", context, lm.next_token_logprobs_sync(context))
                    rows = lm.batch_next_token_logprobs_sync(batch)
                    for context, row in zip(batch, rows):
                        check(k, "batch sync", context, row)
                    if done.is_set():
                        break
            except BaseException as exc:  # noqa: BLE001 - reported by the check
                errors.append(exc)

        threads = [
            threading.Thread(target=calls, args=(k, parts[k], parts[1 - k]), daemon=True)
            for k in range(2)
        ]
        for thread in threads:
            thread.start()

        async def in_flight() -> list[np.ndarray]:
            requests = [asyncio.ensure_future(lm.next_token_logprobs(c)) for c in on_loop]
            await asyncio.sleep(0)  # every request made
            go.set()
            return await asyncio.wait_for(asyncio.gather(*requests), _THREAD_TIMEOUT_S)

        try:
            rows = asyncio.run(in_flight())
        finally:
            go.set()
            done.set()
            for thread in threads:
                thread.join(_THREAD_TIMEOUT_S)
        assert not any(t.is_alive() for t in threads), (
            f"a sync call from another thread did not return within {_THREAD_TIMEOUT_S} s"
        )
        if errors:
            pytest.fail(f"a sync call from another thread raised {errors[0]!r}")
        for context, row in zip(on_loop, rows):
            np.testing.assert_allclose(
                row,
                expected[tuple(context)],
                atol=self.atol,
                err_msg=f"async request {context}, made while other threads called sync twins",
            )
        assert min(checked) >= sum(map(len, parts))  # a full pass each
        for how, context, row in first_wrong:
            np.testing.assert_allclose(
                row,
                expected[tuple(context)],
                atol=self.atol,
                err_msg=f"{sum(wrong)} of {sum(checked)} rows from other threads wrong, "
                f"among them {how}: {context}",
            )

    # ---- cancellation ----------------------------------------------------------------

    def test_cancelled_waiter_does_not_disturb_others(self, lm, contexts):
        """Cancelling one waiter leaves the others' results, for the same context too, intact."""
        lm.clear_cache()

        async def scenario():
            tasks = [asyncio.create_task(lm.next_token_logprobs(c)) for c in contexts]
            twin = asyncio.create_task(lm.next_token_logprobs(contexts[0]))
            await asyncio.sleep(0)
            done_at_once = tasks[0].done()
            tasks[0].cancel()
            results = await asyncio.gather(*tasks[1:], twin)
            if not done_at_once:
                with pytest.raises(asyncio.CancelledError):
                    await tasks[0]
            return done_at_once, results

        done_at_once, results = asyncio.run(scenario())
        assert not done_at_once, (
            "a request finished in its first step on the event loop, so it could not be "
            "cancelled: the model computes on the event loop (blocking every other "
            "coroutine) instead of awaiting its worker"
        )
        lm.clear_cache()
        for context, row in zip(contexts[1:] + [contexts[0]], results):
            np.testing.assert_allclose(row, lm.next_token_logprobs_sync(context), atol=self.atol)

    # ---- closing ---------------------------------------------------------------------

    def test_close_is_idempotent_and_refuses_later_calls(self, make_lm):
        """``close()`` (where the model has one) and ``aclose()`` finish, twice each, and
        then every request method raises ModelClosedError while ``clear_cache()`` does
        nothing; a step that takes :attr:`close_timeout_s` fails the check as hung."""
        lm = make_lm()
        with self._closing(lm):
            context = _distinct_contexts(lm, 1, seed=_CLOSE_SEED)[0]
            self._within("a row before the close", partial(lm.next_token_logprobs_sync, context))
            closes = [("close()", lm.close), ("close() again", lm.close)] if has_close(lm) else []
            closes += [("aclose()", aclose_call(lm)), ("aclose() again", aclose_call(lm))]
            for what, close in closes:
                self._within(what, close)
            self._assert_refuses(lm)

    def test_aclose_with_requests_in_flight_resolves_each(self, make_lm):
        """Leaving ``async with lm`` (``aclose()``) while requests are in flight, some with
        the backend, some still queued and some sync calls on other threads (rows, batches,
        a seeded and an unseeded ``sample``), finishes, and each request then ends with its
        result (the rows and seeded tokens computed before, within ``atol``) or
        ModelClosedError, none left pending; ``aclose()`` again returns, and every call
        raises ModelClosedError."""
        lm = make_lm()
        with self._closing(lm):
            requests = self._requests_to_close_on(lm)
            stage = ["making the requests"]

            async def scenario() -> tuple[dict[str, object], list[str]]:
                async with lm:
                    tasks = await make_requests(requests)
                    stage.append("aclose(), on leaving `async with lm`")
                stage.append("the requests made before the close, after it")
                return await settle(tasks, self.close_timeout_s)

            outcomes, pending = self._within(
                "`async with lm` with requests in flight",
                lambda: asyncio.run(scenario()),
                stage=stage,
                steps=3,
            )
            assert_resolved(requests, outcomes, pending, self.close_timeout_s)
            self._within("aclose() again", aclose_call(lm))
            self._assert_refuses(lm)

    def test_close_from_other_threads_with_requests_in_flight(self, make_lm):
        """``close()`` from two other threads at once, while the requests of the previous
        check are in flight on an event loop, returns in both; each request then ends with
        its result or ModelClosedError, none left pending, and every call raises
        ModelClosedError."""
        lm = make_lm()
        with self._closing(lm):
            if not has_close(lm):
                pytest.skip("the model has no sync close() (the protocol's is aclose())")
            requests = self._requests_to_close_on(lm)
            made = threading.Event()

            async def on_loop() -> tuple[dict[str, object], list[str]]:
                try:
                    tasks = await make_requests(requests)
                finally:  # made, or failed: loop.result raises why
                    made.set()
                return await settle(tasks, 2 * self.close_timeout_s)  # the close, then they

            loop = InThread(lambda: asyncio.run(on_loop()))
            if not made.wait(self.close_timeout_s):
                pytest.fail(f"making the requests did not finish within {self.close_timeout_s:g} s")
            closers = [InThread(lm.close) for _ in range(2)]
            for closer in closers:
                closer.result(self.close_timeout_s, "close() from another thread, in flight")
            outcomes, pending = loop.result(
                3 * self.close_timeout_s, "the requests on the event loop, after close()"
            )
            assert_resolved(requests, outcomes, pending, 2 * self.close_timeout_s)
            self._within("close() again", lm.close)
            self._assert_refuses(lm)

    def _requests_to_close_on(self, lm: AsyncLM) -> list[InFlight]:
        """The requests a close check makes before it closes ``lm``, with the results each
        may end with, computed first (then the cache is cleared, so that none is a hit).
        Made first (wave 0): a row for each of 4 contexts (fewer where the context limit
        leaves fewer than 8), a seeded and an unseeded
        ``sample`` of 8 tokens (fewer where ``max_context_length`` stops them), and the
        4 rows by ``batch_next_token_logprobs_sync`` on another thread; made last (wave 1):
        a row for each of 4 more contexts, a batch of them, and one of them by
        ``next_token_logprobs_sync`` on another thread."""
        contexts = _distinct_contexts(lm, 8, seed=_CLOSE_SEED)
        prompt = min(contexts, key=len)
        count = self._room(lm, prompt, 8)
        reference = np.array(
            self._within(
                "the rows before the close", lambda: lm.batch_next_token_logprobs_sync(contexts)
            )
        )
        drawn = self._within(
            "a seeded sample before the close",
            lambda: asyncio.run(lm.sample(prompt, count, [], seed=_CLOSE_SEED)),
        )
        self._within("clear_cache() before the close", lm.clear_cache)
        row_of = {tuple(c): row for c, row in zip(contexts, reference)}
        first = contexts[0::2]
        last = contexts[1::2] or first  # a context limit that leaves one context

        def rows(wave: int, name: str, call: Callable, arg: list, where: str = "") -> InFlight:
            """``call(arg)``, a row request (``arg`` a context) or a batch (contexts)."""
            several = isinstance(arg[0], list)
            expected = np.stack([row_of[tuple(c)] for c in arg]) if several else row_of[tuple(arg)]
            return InFlight(
                f"{name}({arg}){where}, made {('first', 'last')[wave]}",
                wave,
                partial(call, arg),
                partial(rows_problem, expected, self.atol),
            )

        single, batch = lm.next_token_logprobs, lm.batch_next_token_logprobs
        vocab_size = len(lm.vocab)
        return [
            *(rows(0, "next_token_logprobs", single, c) for c in first),
            InFlight(
                f"sample({prompt}, {count}, seed={_CLOSE_SEED})",
                0,
                partial(lm.sample, prompt, count, [], seed=_CLOSE_SEED),
                partial(tokens_problem, drawn, count, vocab_size),
            ),
            InFlight(
                f"sample({prompt}, {count}), unseeded",
                0,
                partial(lm.sample, prompt, count, []),
                partial(tokens_problem, None, count, vocab_size),
            ),
            rows(
                0,
                "batch_next_token_logprobs_sync",
                sync_on_a_thread(lm.batch_next_token_logprobs_sync),
                first,
                " on another thread",
            ),
            *(rows(1, "next_token_logprobs", single, c) for c in last),
            rows(1, "batch_next_token_logprobs", batch, last),
            rows(
                1,
                "next_token_logprobs_sync",
                sync_on_a_thread(lm.next_token_logprobs_sync),
                last[0],
                " on another thread",
            ),
        ]

    def _assert_refuses(self, lm: AsyncLM) -> None:
        """Every request method of the closed ``lm``, async, sync and batch, raises
        ModelClosedError (within :attr:`close_timeout_s`), and ``clear_cache()`` returns."""
        context = _distinct_contexts(lm, 1, seed=_CLOSE_SEED)[0]
        calls = {
            "next_token_logprobs": lambda: asyncio.run(lm.next_token_logprobs(context)),
            "batch_next_token_logprobs": lambda: asyncio.run(
                lm.batch_next_token_logprobs([context])
            ),
            "sample": lambda: asyncio.run(lm.sample(context, 1, [])),
            "batch_sample": lambda: asyncio.run(lm.batch_sample([context], 1, [])),
            "next_token_logprobs_sync": lambda: lm.next_token_logprobs_sync(context),
            "batch_next_token_logprobs_sync": lambda: lm.batch_next_token_logprobs_sync([context]),
        }
        for name, call in calls.items():
            outcome = self._within(f"{name} on the closed model", partial(outcome_of, call))
            assert isinstance(outcome, ModelClosedError), (
                f"{name} on the closed model gave {describe_outcome(outcome)}, not ModelClosedError"
            )
        self._within("clear_cache() on the closed model", lm.clear_cache)

    def _within(
        self, what: str, call: Callable[[], T], *, stage: list[str] | None = None, steps: int = 1
    ) -> T:
        """``call()``, on another thread, whose result or exception it returns or raises;
        fails the check, naming ``what`` (and the last of ``stage``), where it takes
        ``steps`` times :attr:`close_timeout_s`."""
        return InThread(call).result(steps * self.close_timeout_s, what, stage)

    @contextlib.contextmanager
    def _closing(self, lm: AsyncLM) -> Iterator[None]:
        """Closes ``lm`` after the check's body, however it ended, so that the next check
        can make its model (waiting :attr:`close_timeout_s` at most: a close that hangs is
        left to its thread; what it raises, the check has seen)."""
        try:
            yield
        finally:
            InThread(lm.close if has_close(lm) else aclose_call(lm)).wait(self.close_timeout_s)


def _limit(lm: AsyncLM) -> int | None:
    """The model's ``max_context_length``, or None where it has none."""
    return getattr(lm, "max_context_length", None)


def _need(contexts: list[list[int]], count: int) -> None:
    """Skip a check that needs ``count`` distinct contexts where the model's context limit
    and vocabulary leave fewer."""
    if len(contexts) < count:
        pytest.skip(
            f"needs {count} distinct contexts; the model's max_context_length and "
            f"vocabulary leave {len(contexts)}"
        )


def _after(before: list[list[int]], context: list[int]) -> str:
    """Names ``context`` and the contexts computed ``before`` it, with the tokens each
    shares with it, for a failure message."""
    history = ", ".join(
        f"{len(c)} tokens ({len(os.path.commonprefix([c, context]))} shared)" for c in before
    )
    return f"the {len(context)}-token context {context}, computed after: {history or 'none'}"


def _distinct_contexts(lm: AsyncLM, wanted: int, seed: int) -> list[list[int]]:
    """``wanted`` distinct valid contexts, or fewer where ``max_context_length`` and the
    vocabulary leave fewer: random bodies of 1 to 8 tokens after the BOS token as in
    ``contexts``, in the order drawn."""
    rng = np.random.default_rng(seed)
    start, room = _start_and_room(lm, 8)
    text_ids = np.asarray(lm.vocab.text_ids)
    out: dict[tuple[int, ...], None] = {}  # distinct, in the order drawn
    for _ in range(20 * wanted):  # a model with room for enough contexts has them drawn
        length = int(rng.integers(1, room + 1))
        out[tuple(start + [int(t) for t in rng.choice(text_ids, size=length)])] = None
        if len(out) == wanted:
            break
    return [list(c) for c in out]


def _start_and_room(lm: AsyncLM, longest: int) -> tuple[list[int], int]:
    """How the kit's contexts begin and how many tokens may follow (at most ``longest``):
    the BOS token if the model has one and its context limit leaves room for a token after
    it, else nothing (a limit of 1 token)."""
    start = [] if lm.vocab.bos_token_id is None else [lm.vocab.bos_token_id]
    limit = _limit(lm)
    if limit is not None and limit <= len(start):
        start = []
    return start, longest if limit is None else min(longest, limit - len(start))


#: How long the thread check waits for a call before it fails it as hung (seconds).
_THREAD_TIMEOUT_S = 60
#: Most passes each thread of the thread check makes over its contexts while the async
#: requests are in flight.
_THREAD_PASSES = 5

#: The smallest tail probability a sampled count may have: a correct sampler's count falls
#: below it in either tail with a chance of at most twice this, so a kit run's 16 counts
#: (two temperatures, four ways, two events) fail together at most once in 10^7 runs.
_TAIL = 3e-9


def _assert_draws_follow(drawn: np.ndarray, row: np.ndarray, temperature: float, name: str) -> None:
    """Assert that first tokens ``drawn`` at ``temperature`` follow ``row`` (float64
    log-probabilities); see :meth:`AsyncLMConformance.test_draws_follow_the_tempered_row`."""
    assert np.isfinite(row[drawn]).all(), f"{name}: drew a token of probability 0"
    scores = row / temperature
    p = np.exp(scores - scores.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    half = order[: int(np.searchsorted(np.cumsum(p[order]), 0.5)) + 1]
    n = len(drawn)
    for event, tokens in (("the most likely token", order[:1]), ("the top half", half)):
        q = min(float(p[tokens].sum()), 1.0)
        count = int(np.isin(drawn, tokens).sum())
        # Exact tails: a normal approximation is far too tight for a q near 0 or 1.
        low, high = binom.cdf(count, n, q), binom.sf(count - 1, n, q)
        assert min(low, high) >= _TAIL, (
            f"{name}: {count} of {n} draws at temperature {temperature} were {event} "
            f"({len(tokens)} tokens, probability {q:.6g}; expected {n * q:.1f}): "
            f"a binomial tail of {min(low, high):.3g}"
        )
