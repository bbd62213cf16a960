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

Every check runs its coroutines with ``asyncio.run``, one event loop per check, so the
suite also proves the model survives successive event loops. Tolerances are class
attributes, so a backend with batch-dependent kernels can loosen ``atol`` explicitly.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from scipy.special import logsumexp

from genlm.core._errors import InvalidContextError
from genlm.core._protocol import AsyncLM

__all__ = ["AsyncLMConformance"]


class AsyncLMConformance:
    """Checks every ``AsyncLM`` must pass. Override the ``lm`` fixture."""

    #: Largest allowed difference between two computations of the same log-probabilities.
    atol: float = 1e-4
    #: Largest allowed ``|logsumexp(row)|``.
    normalization_tol: float = 1e-4

    @pytest.fixture(scope="class")
    @classmethod
    def lm(cls) -> AsyncLM:
        """The model under test (override this)."""
        pytest.fail("override the `lm` fixture in your AsyncLMConformance subclass")

    @pytest.fixture(scope="class")
    @classmethod
    def contexts(cls, lm: AsyncLM) -> list[list[int]]:
        """A few distinct valid contexts of different lengths (override to choose them)."""
        rng = np.random.default_rng(1234)
        start = [] if lm.vocab.bos_token_id is None else [lm.vocab.bos_token_id]
        text_ids = np.asarray(lm.vocab.text_ids)
        out = []
        for length in (1, 2, 3, 5, 8):
            body = [int(t) for t in rng.choice(text_ids, size=length)]
            out.append(start + body)
        return out

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
        """A repeated request (a cache hit) returns what the first one computed."""
        lm.clear_cache()
        first = np.array(asyncio.run(lm.next_token_logprobs(contexts[2])))
        again = asyncio.run(lm.next_token_logprobs(contexts[2]))
        np.testing.assert_array_equal(first, again)
        lm.clear_cache()
        np.testing.assert_allclose(
            asyncio.run(lm.next_token_logprobs(contexts[2])), first, atol=self.atol
        )

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
        """An id past the vocabulary raises an error that names it."""
        bad = len(lm.vocab)
        with pytest.raises(InvalidContextError, match=str(bad)):
            asyncio.run(lm.next_token_logprobs([0, bad]))

    def test_bad_request_does_not_poison_others(self, lm, contexts):
        """A failing request among concurrent good ones fails alone."""
        lm.clear_cache()

        async def mixed():
            return await asyncio.gather(
                lm.next_token_logprobs(contexts[0]),
                lm.next_token_logprobs([len(lm.vocab) + 5]),
                lm.next_token_logprobs(contexts[1]),
                return_exceptions=True,
            )

        first, failure, second = asyncio.run(mixed())
        assert isinstance(failure, InvalidContextError)
        lm.clear_cache()
        np.testing.assert_allclose(first, lm.next_token_logprobs_sync(contexts[0]), atol=self.atol)
        np.testing.assert_allclose(second, lm.next_token_logprobs_sync(contexts[1]), atol=self.atol)

    # ---- sampling --------------------------------------------------------------------

    def test_sample_honours_max_tokens(self, lm, contexts):
        """A sample never exceeds max_tokens, and max_tokens=0 gives nothing."""
        out = asyncio.run(lm.sample(contexts[0], max_tokens=4, eos_token_ids=[], seed=0))
        assert len(out) == 4
        assert all(0 <= t < len(lm.vocab) for t in out)
        assert asyncio.run(lm.sample(contexts[0], max_tokens=0, eos_token_ids=[], seed=0)) == []

    def test_sample_stops_at_eos(self, lm, contexts):
        """A sample ends with the first EOS token it draws."""
        everything = list(range(len(lm.vocab)))
        out = asyncio.run(lm.sample(contexts[0], max_tokens=5, eos_token_ids=everything, seed=0))
        assert len(out) == 1
        greedy = asyncio.run(lm.sample(contexts[0], max_tokens=6, eos_token_ids=[], temperature=0))
        eos = [greedy[2]]
        stopped = asyncio.run(
            lm.sample(contexts[0], max_tokens=6, eos_token_ids=eos, temperature=0)
        )
        assert stopped == greedy[: greedy.index(eos[0]) + 1]

    def test_sample_is_seeded(self, lm, contexts):
        """The same seed gives the same tokens; batch_sample returns one list per prompt."""
        a = asyncio.run(lm.sample(contexts[1], max_tokens=6, eos_token_ids=[], seed=7))
        b = asyncio.run(lm.sample(contexts[1], max_tokens=6, eos_token_ids=[], seed=7))
        assert a == b
        batch = asyncio.run(lm.batch_sample(contexts[:3], max_tokens=3, eos_token_ids=[], seed=11))
        again = asyncio.run(lm.batch_sample(contexts[:3], max_tokens=3, eos_token_ids=[], seed=11))
        assert batch == again
        assert [len(s) for s in batch] == [3, 3, 3]

    def test_greedy_sample_follows_argmax(self, lm, contexts):
        """temperature=0 picks the most likely token at every step."""
        out = asyncio.run(lm.sample(contexts[0], max_tokens=3, eos_token_ids=[], temperature=0))
        context = list(contexts[0])
        for token in out:
            row = lm.next_token_logprobs_sync(context)
            assert row[token] >= row.max() - self.atol
            context.append(token)

    # ---- cancellation ----------------------------------------------------------------

    def test_cancelled_waiter_does_not_disturb_others(self, lm, contexts):
        """Cancelling one waiter leaves the others' results, for the same context too, intact."""
        lm.clear_cache()

        async def scenario():
            tasks = [asyncio.create_task(lm.next_token_logprobs(c)) for c in contexts]
            twin = asyncio.create_task(lm.next_token_logprobs(contexts[0]))
            await asyncio.sleep(0)
            tasks[0].cancel()
            results = await asyncio.gather(*tasks[1:], twin)
            with pytest.raises(asyncio.CancelledError):
                await tasks[0]
            return results

        results = asyncio.run(scenario())
        lm.clear_cache()
        for context, row in zip(contexts[1:] + [contexts[0]], results):
            np.testing.assert_allclose(row, lm.next_token_logprobs_sync(context), atol=self.atol)
