"""The conformance kit fails backends with the bugs state reuse, padding and threads make,
and passes correct ones it used to fail (a short context limit, nondeterministic kernels).

The kit is run on each backend in a child pytest (its checks are pytest tests), and the
checks that failed are read from the child's summary, what they said from its reports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BACKENDS = textwrap.dedent(
    '''
    import asyncio
    import threading
    import time

    import numpy as np
    import pytest
    from scipy.special import logsumexp

    from genlm.core import ModelClosedError, Vocabulary
    from genlm.core.backend import BatchedLM
    from genlm.core.mock import MockLM, mock_logprobs
    from genlm.core.testing import AsyncLMConformance

    V = 512
    VOCAB = Vocabulary(
        (b"<s>", b"</s>") + tuple(b"t%d" % i for i in range(V - 2)),
        special_ids={0, 1}, bos_token_id=0, eos_token_ids=(1,),
    )


    class Correct(BatchedLM):
        stable_batches = True

        def __init__(self, **options):
            super().__init__(VOCAB, **options)

        def _logprobs_batch(self, contexts, variant):
            return np.stack([mock_logprobs(c, V) for c in contexts])


    class SortsByLength(Correct):
        """Pads by sorting the batch by length, and returns the rows in that order."""

        def _logprobs_batch(self, contexts, variant):
            return super()._logprobs_batch(sorted(contexts, key=len), variant)


    class StalePrefixState(Correct):
        """Resumes a context from a cached prefix's state and returns the prefix's row."""

        def __init__(self, **options):
            super().__init__(**options)
            self.state = {}

        def _clear_backend_cache(self):
            self.state.clear()

        def _logprobs_batch(self, contexts, variant):
            rows = []
            for c in contexts:
                hit = next((c[:k] for k in range(len(c), 0, -1) if c[:k] in self.state), c)
                rows.append(self.state.setdefault(hit, mock_logprobs(hit, V)))
                self.state.setdefault(c, rows[-1])
            return np.stack(rows)


    class CacheKeyedByLength(Correct):
        """Keys its own row cache by the context's length."""

        def __init__(self, **options):
            super().__init__(**options)
            self.rows = {}

        def _clear_backend_cache(self):
            self.rows.clear()

        def _logprobs_batch(self, contexts, variant):
            return np.stack([self.rows.setdefault(len(c), mock_logprobs(c, V)) for c in contexts])


    class ReusesItsBuffer(Correct):
        """Declares stable_batches but writes each batch into the array it returned last."""

        def __init__(self, **options):
            super().__init__(**options)
            self.buffer = np.zeros((64, V), dtype=np.float32)

        def _logprobs_batch(self, contexts, variant):
            self.buffer[: len(contexts)] = super()._logprobs_batch(contexts, variant)
            return self.buffer[: len(contexts)]


    class WrapsPastEightSlots(Correct):
        """Keeps a batch's contexts in 8 slots: past 8 contexts a slot is overwritten, and
        the rows of the contexts that first held it are the later ones'."""

        def _logprobs_batch(self, contexts, variant):
            slots = {}
            for i, c in enumerate(contexts):
                slots[i % 8] = c
            return super()._logprobs_batch([slots[i % 8] for i in range(len(contexts))], variant)


    class WrongPastOneKVBlock(Correct):
        """A paged KV cache of 16-token blocks (vLLM's default size) that, resuming a
        context from a cached prefix longer than one block, reads a block at the wrong
        offset (skips a token): right for contexts of up to 16 tokens or computed fresh."""

        def __init__(self, **options):
            super().__init__(**options)
            self.cached = set()

        def _clear_backend_cache(self):
            self.cached.clear()

        def _logprobs_batch(self, contexts, variant):
            rows = []
            for c in contexts:
                resumed = any(c[:n] in self.cached for n in range(17, len(c)))
                rows.append(mock_logprobs(c[:16] + c[17:] if resumed else c, V))
                self.cached.add(c)
            return np.stack(rows)


    class SyncOnCallersThread(Correct):
        """Its sync twins run the engine on the caller's thread instead of the worker, and
        the engine (which releases the GIL while it computes, as a real one does) builds
        each row in one scratch buffer: right alone, wrong when a sync call from another
        thread overlaps a batch on the worker."""

        def __init__(self, **options):
            super().__init__(**options)
            self.scratch = np.zeros(V, dtype=np.float32)

        def _logprobs_batch(self, contexts, variant):
            rows = []
            for c in contexts:
                self.scratch[:] = mock_logprobs(c, V)
                time.sleep(0.0002)
                rows.append(self.scratch.copy())
            return np.stack(rows)

        def _rows_sync(self, requests, cached=True):
            return list(self._logprobs_batch([r.ids for r in requests], None))


    class ComputesOnTheLoop(Correct):
        """Its coroutine awaits nothing: it computes on the event loop, blocking it."""

        async def next_token_logprobs(self, token_ids, **options):
            return self.next_token_logprobs_sync(token_ids, **options)


    class DropsARow(Correct):
        """Returns one row too few for a batch of more than one context."""

        def _logprobs_batch(self, contexts, variant):
            rows = super()._logprobs_batch(contexts, variant)
            return rows[:-1] if len(rows) > 1 else rows


    class Noisy(Correct):
        """Correct, with kernels that differ by about 1e-6 from call to call."""

        def __init__(self, **options):
            super().__init__(**options)
            self.rng = np.random.default_rng(0)

        def _logprobs_batch(self, contexts, variant):
            rows = super()._logprobs_batch(contexts, variant)
            rows = rows + self.rng.normal(0, 1e-6, rows.shape)
            return rows - logsumexp(rows, axis=1, keepdims=True)


    class EosLikely(Correct):
        """Correct, with rows that give the EOS token (id 1) a third of the mass."""

        def _logprobs_batch(self, contexts, variant):
            rows = np.exp(super()._logprobs_batch(contexts, variant)) * (2 / 3)
            rows[:, 1] += 1 / 3
            return np.log(rows)


    class UnseededAlwaysGreedy(Correct):
        """Its own unseeded sampler ignores the temperature: always greedy."""

        async def sample(self, prompt, max_tokens, eos_token_ids=None, temperature=1.0, seed=None):
            temperature = 0.0 if seed is None else temperature
            return await super().sample(prompt, max_tokens, eos_token_ids, temperature, seed)

        async def batch_sample(self, prompts, max_tokens, eos_ids=None, temperature=1.0, seed=None):
            temperature = 0.0 if seed is None else temperature
            return await super().batch_sample(prompts, max_tokens, eos_ids, temperature, seed)


    class SeedIgnored(Correct):
        """Every seed, and no seed, draws seed 0's streams."""

        async def sample(self, prompt, max_tokens, eos_token_ids=None, temperature=1.0, seed=None):
            return await super().sample(prompt, max_tokens, eos_token_ids, temperature, 0)

        async def batch_sample(self, prompts, max_tokens, eos_ids=None, temperature=1.0, seed=None):
            return await super().batch_sample(prompts, max_tokens, eos_ids, temperature, 0)


    class BatchSampleReversed(Correct):
        """Returns batch_sample's continuations in reverse prompt order."""

        async def batch_sample(self, prompts, *args, **kwargs):
            return (await super().batch_sample(prompts, *args, **kwargs))[::-1]


    class TemperatureIgnored(Correct):
        """Samples every positive temperature at 1."""

        async def sample(self, prompt, max_tokens, eos_token_ids=None, temperature=1.0, seed=None):
            temperature = 1.0 if temperature else 0.0
            return await super().sample(prompt, max_tokens, eos_token_ids, temperature, seed)


    class DefaultEosIgnored(EosLikely):
        """Takes eos_token_ids=None for no EOS at all (not the vocabulary's)."""

        async def sample(self, prompt, max_tokens, eos_token_ids=None, temperature=1.0, seed=None):
            eos = [] if eos_token_ids is None else eos_token_ids
            return await super().sample(prompt, max_tokens, eos, temperature, seed)


    class CloseHangs(Correct):
        """Its release waits for a signal that never comes (a few seconds, then gives up:
        the checks fail it after 0.5 s, and the child's exit waits for its thread)."""

        def _close_backend(self):
            threading.Event().wait(3)


    class ServesOnceClosed(Correct):
        """Its close does nothing: a closed model still computes rows and samples."""

        def close(self):
            pass

        async def aclose(self):
            pass


    class WaitsOnceClosed(Correct):
        """A request failed by the close waits for a reopening that never comes, and so
        does a request made on the closed model."""

        async def next_token_logprobs(self, token_ids, **options):
            try:
                return await super().next_token_logprobs(token_ids, **options)
            except ModelClosedError:
                await asyncio.Event().wait()


    class LeavesQueuedRequestsPending(WaitsOnceClosed):
        """Refuses a request made on the closed model, but a request still queued when
        it closed waits for a reopening that never comes."""

        def __init__(self, **options):
            super().__init__(**options)
            self.closing = False

        async def next_token_logprobs(self, token_ids, **options):
            if self.closing:
                raise ModelClosedError("closed")
            return await super().next_token_logprobs(token_ids, **options)

        def close(self):
            self.closing = True
            super().close()

        async def aclose(self):
            self.closing = True
            await super().aclose()


    class FreesWeightsFirst(Correct):
        """Its close frees the weights at once, under the batch still running (each takes
        50 ms), which then computes uniform rows (normalized: core cannot tell)."""

        def __init__(self, **options):
            super().__init__(**options)
            self.weights = True

        def _logprobs_batch(self, contexts, variant):
            time.sleep(0.05)
            if self.weights:
                return super()._logprobs_batch(contexts, variant)
            return np.full((len(contexts), V), -np.log(V), dtype=np.float32)

        def close(self):
            self.weights = False
            super().close()

        async def aclose(self):
            self.weights = False
            await super().aclose()


    def shifted_vocabulary(**options):
        """stories260K's mock with its tokenizer, every token's bytes moved to the next id."""
        lm = MockLM.from_name("stories260K")
        vocab, tokenizer = lm.vocab, lm.tokenizer
        lm.close()
        tokens = vocab.tokens[-1:] + vocab.tokens[:-1]
        shifted = Vocabulary(
            tokens, special_ids=vocab.special_ids, bos_token_id=vocab.bos_token_id,
            eos_token_ids=vocab.eos_token_ids,
        )
        return MockLM(shifted, tokenizer=tokenizer, **options)


    def kit(backend, atol=1e-4, **options):
        class Kit(AsyncLMConformance):
            @pytest.fixture(scope="class")
            @classmethod
            def lm(cls):
                model = backend(**options)
                yield model
                model.close()

        Kit.atol = atol
        return Kit


    def closing_kit(backend, atol=1e-4, only=False, timeout=60.0, **options):
        """``kit`` with the close checks, each on a new model, failed as hung after
        ``timeout`` seconds; ``only``: the other checks skip (a backend broken at close)."""

        class Kit(kit(backend, atol, **options)):
            close_timeout_s = timeout

            @pytest.fixture(scope="class")
            @classmethod
            def make_lm(cls):
                return lambda: backend(**options)

            if only:

                @pytest.fixture(scope="class")
                @classmethod
                def lm(cls):
                    pytest.skip("a backend broken at close: the close checks alone")

        return Kit


    TestCorrect = closing_kit(Correct)
    TestCorrectUncached = closing_kit(Correct, cache_bytes=0)
    TestShortLimit = kit(Correct, max_context_length=6)
    TestLongContextsCut = kit(Correct, max_context_length=20)
    TestLimitOne = closing_kit(Correct, max_context_length=1)
    TestLimitOneThreeTokens = closing_kit(MockLM, vocab=[b"a", b"b", b"c"], max_context_length=1)
    TestSmallBatches = closing_kit(Correct, max_batch_size=5)
    TestNoisyUncached = closing_kit(Noisy, atol=1e-3, cache_bytes=0)
    TestNoisyTinyCache = kit(Noisy, atol=1e-3, cache_bytes=1000)  # a row is 2 KiB
    TestSortsByLength = kit(SortsByLength)
    TestStalePrefixState = kit(StalePrefixState)
    TestStalePrefixStateUncached = kit(StalePrefixState, cache_bytes=0)
    TestCacheKeyedByLength = kit(CacheKeyedByLength, cache_bytes=0)
    TestReusesItsBuffer = kit(ReusesItsBuffer, cache_bytes=0)
    TestWrapsPastEightSlots = kit(WrapsPastEightSlots)
    TestEosLikely = kit(EosLikely)
    TestUnseededAlwaysGreedy = kit(UnseededAlwaysGreedy)
    TestSeedIgnored = kit(SeedIgnored)
    TestBatchSampleReversed = kit(BatchSampleReversed)
    TestTemperatureIgnored = kit(TemperatureIgnored)
    TestDefaultEosIgnored = kit(DefaultEosIgnored)
    TestShiftedVocabulary = kit(shifted_vocabulary)
    TestWrongPastOneKVBlock = kit(WrongPastOneKVBlock)
    TestSyncOnCallersThread = kit(SyncOnCallersThread)
    TestComputesOnTheLoop = kit(ComputesOnTheLoop)
    TestDropsARow = kit(DropsARow)
    TestCloseHangs = closing_kit(CloseHangs, only=True, timeout=0.5)
    TestServesOnceClosed = closing_kit(ServesOnceClosed, only=True, timeout=5.0)
    TestWaitsOnceClosed = closing_kit(WaitsOnceClosed, only=True, timeout=0.5)
    TestLeavesQueuedRequestsPending = closing_kit(
        LeavesQueuedRequestsPending, only=True, timeout=0.5
    )
    TestFreesWeightsFirst = closing_kit(FreesWeightsFirst, only=True, timeout=5.0)
    '''
)


@pytest.fixture(scope="module")
def kit_output(tmp_path_factory) -> str:
    """What the child pytest running the kit on the module above printed."""
    folder = tmp_path_factory.mktemp("kit")
    (folder / "test_backends.py").write_text(BACKENDS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfEsp", "-p", "no:cacheprovider", "-c", os.devnull]
        + ["--rootdir", str(folder), str(folder / "test_backends.py")],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=Path(folder),
        env=env,
    )
    assert "passed" in run.stdout, run.stdout + run.stderr
    return run.stdout


@pytest.fixture(scope="module")
def failed_checks(kit_output) -> dict[str, set[str]]:
    """Each kit class of the module above and the checks of it that failed."""
    failed: dict[str, set[str]] = {}  # a check that errors (a fixture raised) counts too
    for cls, check in re.findall(r"^(?:FAILED|ERROR) \S+::(\w+)::(\w+)", kit_output, re.MULTILINE):
        failed.setdefault(cls, set()).add(check)
    return failed


@pytest.mark.parametrize(
    "cls",
    ["TestCorrect", "TestCorrectUncached", "TestLongContextsCut", "TestShortLimit"]
    + ["TestLimitOne", "TestLimitOneThreeTokens", "TestSmallBatches", "TestNoisyUncached"]
    + ["TestNoisyTinyCache", "TestEosLikely"],
)
def test_correct_backends_pass(failed_checks, cls):
    """A correct backend passes: with or without the output cache, with a context limit
    of 20 tokens (the long contexts cut short), of 6 (no long contexts: that check skips)
    or of 1 (no room for a token after BOS; over three tokens, too few distinct contexts
    for some checks, which skip), with batches of at most 5 contexts (the large batch is
    a full one and a partial one), with kernels that vary within ``atol``
    and no cache or a cache too small for a row (whose repeated request is a recomputation,
    not a hit), and with an EOS token drawn a third of the time."""
    assert cls not in failed_checks


@pytest.mark.parametrize(
    ("cls", "check"),
    [
        ("TestSortsByLength", "test_batch_equals_single"),
        ("TestStalePrefixState", "test_reused_state_equals_fresh"),
        ("TestStalePrefixStateUncached", "test_reused_state_equals_fresh"),
        ("TestCacheKeyedByLength", "test_reused_state_equals_fresh"),
        ("TestReusesItsBuffer", "test_held_rows_do_not_change"),
        ("TestWrapsPastEightSlots", "test_large_batch_equals_single"),
        ("TestUnseededAlwaysGreedy", "test_draws_follow_the_tempered_row"),
        ("TestSeedIgnored", "test_draws_follow_the_tempered_row"),
        ("TestSeedIgnored", "test_seeds_change_the_draws"),
        ("TestBatchSampleReversed", "test_batch_sample_keeps_prompt_order"),
        ("TestTemperatureIgnored", "test_draws_follow_the_tempered_row"),
        ("TestDefaultEosIgnored", "test_default_eos_is_the_vocabularys"),
        ("TestShiftedVocabulary", "test_vocabulary_spells_the_tokenizers_ids"),
        ("TestComputesOnTheLoop", "test_cancelled_waiter_does_not_disturb_others"),
        ("TestDropsARow", "test_bad_request_does_not_poison_others"),
    ],
)
def test_broken_backends_fail(failed_checks, cls, check):
    """Each broken backend fails the check aimed at its bug."""
    assert check in failed_checks.get(cls, set())


#: The kit's close checks, by the names of their tests.
CLOSE_CHECKS = {
    "test_close_is_idempotent_and_refuses_later_calls",
    "test_aclose_with_requests_in_flight_resolves_each",
    "test_close_from_other_threads_with_requests_in_flight",
}


@pytest.mark.parametrize(
    "cls",
    ["TestCorrect", "TestCorrectUncached", "TestLimitOne", "TestLimitOneThreeTokens"]
    + ["TestSmallBatches", "TestNoisyUncached"],
)
def test_correct_backends_pass_the_close_checks(kit_output, failed_checks, cls):
    """A correct backend given a ``make_lm`` runs the close checks and passes them: with
    or without the output cache, a context limit of 1 (one or three distinct contexts),
    batches of at most 5, kernels that vary within ``atol``."""
    assert not CLOSE_CHECKS & failed_checks.get(cls, set())
    passed = set(re.findall(rf"^PASSED \S+::{cls}::(\w+)", kit_output, re.MULTILINE))
    assert CLOSE_CHECKS <= passed


def test_close_checks_skip_without_make_lm(kit_output):
    """A kit subclass that overrides ``lm`` alone (every plugin's before the close checks)
    runs as before: each of its close checks skips, saying how to run them."""
    without = len(re.findall(r"^Test\w+ = kit\(", BACKENDS, re.MULTILINE))
    reason = r"^SKIPPED \[(\d+)\] .*: the close checks need a new model each: override the"
    counts = re.findall(reason, kit_output, re.MULTILINE)
    assert sum(map(int, counts)) == len(CLOSE_CHECKS) * without


@pytest.mark.parametrize(
    ("cls", "check", "says"),
    [
        (
            "TestCloseHangs",
            "test_close_is_idempotent_and_refuses_later_calls",
            "close() did not finish within 0.5 s",
        ),
        (
            "TestCloseHangs",
            "test_aclose_with_requests_in_flight_resolves_each",
            "(it was at: aclose(), on leaving `async with lm`)",
        ),
        (
            "TestCloseHangs",
            "test_close_from_other_threads_with_requests_in_flight",
            "close() from another thread, in flight did not finish within 0.5 s",
        ),
        (
            "TestServesOnceClosed",
            "test_close_is_idempotent_and_refuses_later_calls",
            "next_token_logprobs on the closed model gave an array of shape (512,), "
            "not ModelClosedError",
        ),
        (
            "TestWaitsOnceClosed",
            "test_close_is_idempotent_and_refuses_later_calls",
            "next_token_logprobs on the closed model did not finish within 0.5 s",
        ),
        (
            "TestLeavesQueuedRequestsPending",
            "test_aclose_with_requests_in_flight_resolves_each",
            "requests made before the close were still pending 0.5 s after it",
        ),
        (
            "TestFreesWeightsFirst",
            "test_aclose_with_requests_in_flight_resolves_each",
            "made first gave rows unlike those computed before the close",
        ),
    ],
)
def test_backends_broken_at_close_fail_saying_how(kit_output, failed_checks, cls, check, says):
    """A close that hangs, or does nothing, calls on a closed model that hang, requests
    queued at the close left pending, and a batch in flight at the close computed from
    freed weights each fail the close check aimed at them, whose report names the bug."""
    assert check in failed_checks.get(cls, set())
    assert says in _report(kit_output, cls, check)


def test_a_close_check_can_fail_alone(failed_checks):
    """A backend that leaves the requests queued at its close pending, but refuses calls
    once closed, passes the check of a plain close and fails the one of a close with
    requests in flight."""
    failed = failed_checks["TestLeavesQueuedRequestsPending"]
    assert "test_aclose_with_requests_in_flight_resolves_each" in failed
    assert "test_close_is_idempotent_and_refuses_later_calls" not in failed


def _report(kit_output: str, cls: str, check: str) -> str:
    """What the child pytest reported of ``cls``'s failed ``check``."""
    sections = re.split(r"^_+ (\S+) _+$", kit_output, flags=re.MULTILINE)
    return dict(zip(sections[1::2], sections[2::2]))[f"{cls}.{check}"]


@pytest.mark.parametrize(
    ("cls", "check"),
    [
        ("TestWrongPastOneKVBlock", "test_long_context_reuse_equals_fresh"),
        ("TestSyncOnCallersThread", "test_sync_calls_from_threads_during_async_requests"),
    ],
)
def test_subtle_backends_fail_one_check(failed_checks, cls, check):
    """A backend wrong only past one 16-token KV block, and one whose sync twins race the
    worker from other threads, pass every check but the one aimed at their bug."""
    assert failed_checks.get(cls) == {check}


@pytest.mark.parametrize(
    ("cls", "check", "says"),
    [
        (
            "TestComputesOnTheLoop",
            "test_cancelled_waiter_does_not_disturb_others",
            "the model computes on the event loop",
        ),
        (
            "TestDropsARow",
            "test_bad_request_does_not_poison_others",
            "made together with a bad one, failed: BackendError(",
        ),
        (
            "TestWrongPastOneKVBlock",
            "test_long_context_reuse_equals_fresh",
            "computed after: 34 tokens (34 shared)",
        ),
    ],
)
def test_failures_say_what_went_wrong(kit_output, cls, check, says):
    """A failing check's report names the bug: a model that computes on the event loop,
    a good request failed beside a bad one (not a TypeError comparing an exception with
    rows), a long context computed after which others."""
    assert says in _report(kit_output, cls, check)
