"""The output seam: ``output="torch"`` rows, backends that hand torch rows in, and ``variant=``."""

from __future__ import annotations

import asyncio
import sys
import types

import numpy as np
import pytest

from genlm.core import BackendError, InvalidContextError, UnknownVariantError
from genlm.core.backend import sample_token
from genlm.core.mock import MockLM, mock_logprobs

VOCAB = [b"a", b"b", b"c", b"ab", b"<eos>"]
CONTEXTS = [[0], [0, 1], [2, 3, 1]]


def expected(context):
    return mock_logprobs(context, len(VOCAB)).astype(np.float32)


class TorchMock(MockLM):
    """The mock's rows, handed to core as a torch tensor (as a GPU backend would)."""

    def _logprobs_batch(self, contexts, variant):
        import torch

        return torch.from_numpy(super()._logprobs_batch(contexts, variant))


def test_unknown_output_or_variant_is_a_clear_error():
    lm = MockLM(VOCAB)
    with pytest.raises(ValueError, match="output must be"):
        lm.next_token_logprobs_sync([0], output="jax")
    with pytest.raises(ValueError, match="no variants"):
        lm.next_token_logprobs_sync([0], variant="adapter")
    with pytest.raises(InvalidContextError):
        lm.batch_next_token_logprobs_sync([[0], []], output="numpy")
    lm.close()


def test_torch_rows_without_torch_say_what_is_missing_before_any_work(monkeypatch):
    """Where torch is not installed (here: hidden), ``output="torch"`` names torch and the
    fix before anything is queued, for every request form."""
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails, find_spec is None
    lm = MockLM(VOCAB)
    calls = (
        lambda: lm.next_token_logprobs_sync([0], output="torch"),
        lambda: lm.batch_next_token_logprobs_sync([[0], [1]], output="torch"),
        lambda: asyncio.run(lm.next_token_logprobs([0], output="torch")),
        lambda: asyncio.run(lm.batch_next_token_logprobs([[0]], output="torch")),
    )
    for call in calls:
        with pytest.raises(ModuleNotFoundError, match="output='torch' needs torch"):
            call()
    assert lm.batch_count == 0
    lm.close()


class AdapterMock(MockLM):
    """A mock serving two named variants, whose rows differ from the base model's."""

    def _served_variants(self):
        return ("a", "b")

    def _logprobs_batch(self, contexts, variant):
        shift = {None: (), "a": (1,), "b": (2,)}[variant]
        return super()._logprobs_batch([c + shift for c in contexts], None)


def test_a_request_names_a_served_variant():
    """``variant=`` takes what ``_served_variants`` lists (each its own rows and cache
    entries) and names the served ones when it gets another."""
    lm = AdapterMock(VOCAB)
    assert np.array_equal(lm.next_token_logprobs_sync([0], variant="a"), expected([0, 1]))
    assert np.array_equal(lm.next_token_logprobs_sync([0], variant="b"), expected([0, 2]))
    assert np.array_equal(lm.next_token_logprobs_sync([0]), expected([0]))
    assert len(lm.output_cache) == 3
    with pytest.raises(KeyError, match="'c'; loaded: 'a', 'b'"):
        lm.next_token_logprobs_sync([0], variant="c")
    keyed = type("Keyed", (AdapterMock,), {"_served_variants": lambda self: {"a": 1}.keys()})
    other = keyed(VOCAB)  # a name that cannot be a key is not a served one either
    with pytest.raises(KeyError, match=r"\['a'\]; loaded: 'a'"):
        other.next_token_logprobs_sync([0], variant=["a"])
    other.close()
    # Also the ValueError genlm-backend 0.3.1 raised, and its message is the plain text
    # (a KeyError's str is the repr of its message).
    with pytest.raises(ValueError) as raised:
        lm.next_token_logprobs_sync([0], variant="c")
    assert isinstance(raised.value, UnknownVariantError)
    assert str(raised.value) == f"{lm.name} has no variant (adapter) 'c'; loaded: 'a', 'b'"
    lm.close()
    unloaded = type("Unloaded", (AdapterMock,), {"_served_variants": lambda self: ()})(VOCAB)
    with pytest.raises(KeyError, match="'a'; loaded: none"):  # adapters, none loaded yet
        unloaded.next_token_logprobs_sync([0], variant="a")
    unloaded.close()


def test_an_unhashable_current_variant_names_the_hook():
    """A backend whose ``_variant()`` returns a dict fails every call, single or batch,
    sync or async, with a BackendError naming the backend and the hook (it was a bare
    "unhashable type: 'dict'"); a hashable one is served as before."""

    class DictVariant(MockLM):
        def _variant(self):
            return {"adapter": "a", "scale": 1.0}

    lm = DictVariant(VOCAB, name="dicts")
    calls = [
        lambda: lm.next_token_logprobs_sync([0]),
        lambda: lm.batch_next_token_logprobs_sync([[0], [1]]),
        lambda: asyncio.run(lm.next_token_logprobs([0])),
        lambda: lm.validate_request([0]),
    ]
    for call in calls:
        with pytest.raises(BackendError, match=r"DictVariant 'dicts': _variant\(\) returned"):
            call()
    with pytest.raises(BackendError, match="_variant must return a hashable variant"):
        lm.next_token_logprobs_sync([0])
    lm.close()
    frozen = type("Frozen", (MockLM,), {"_variant": lambda self: ("adapter", "a")})(VOCAB)
    assert frozen.validate_request([0]) == (("adapter", "a"), (0,))
    frozen.close()


def draws(prompt, shift, max_tokens, rng):
    """Core's sampler by hand over AdapterMock's rows for the variant of ``shift``."""
    context, out = list(prompt), []
    for _ in range(max_tokens):
        token = sample_token(expected(context + list(shift)), rng)
        out.append(token)
        context.append(token)
    return out


def test_sample_draws_every_step_under_its_variant():
    """``sample(variant=)`` and ``batch_sample(variant=)`` draw each step from that
    variant's rows; a served name is checked before any work."""
    lm = AdapterMock(VOCAB)
    prompts = [[0], [2, 3]]
    for variant, shift in ((None, ()), ("a", (1,)), ("b", (2,))):
        drawn = asyncio.run(lm.sample(prompts[1], 6, [], seed=3, variant=variant))
        assert drawn == draws(prompts[1], shift, 6, np.random.default_rng(3))
        batch = asyncio.run(lm.batch_sample(prompts, 5, [], seed=8, variant=variant))
        streams = np.random.SeedSequence(8).spawn(2)
        assert batch == [
            draws(p, shift, 5, np.random.default_rng(s)) for p, s in zip(prompts, streams)
        ]
    with pytest.raises(KeyError, match="'c'"):
        asyncio.run(lm.sample(prompts[0], 2, [], variant="c"))
    with pytest.raises(KeyError, match="'c'"):
        asyncio.run(lm.batch_sample(prompts, 2, [], variant="c"))
    assert len(lm.output_cache) > 0
    lm.close()


class SwitchableMock(AdapterMock):
    """AdapterMock whose current variant (``set_lora``'s) is an attribute."""

    current = None

    def _variant(self):
        return self.current


def test_a_running_sample_keeps_the_variant_it_was_called_with():
    """A sample is a request: the current variant when it is called selects every step,
    as vLLM's own sampler does, even if the model's variant changes while it runs."""
    lm = SwitchableMock(VOCAB)

    async def switch_after_the_first_step():
        task = asyncio.create_task(lm.sample([0], 6, [], seed=5))
        while not len(lm.output_cache):  # the first step's row has been computed
            await asyncio.sleep(0.001)
        lm.current = "b"
        return await asyncio.wait_for(task, 30)

    drawn = asyncio.run(switch_after_the_first_step())
    assert drawn == draws([0], (), 6, np.random.default_rng(5))
    assert asyncio.run(lm.sample([0], 6, [], seed=5)) == draws(
        [0], (2,), 6, np.random.default_rng(5)
    )
    lm.close()


def test_numpy_output_is_unchanged_and_needs_no_torch():
    lm = MockLM(VOCAB)
    rows = lm.batch_next_token_logprobs_sync(CONTEXTS)
    assert isinstance(rows, np.ndarray) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows, [expected(c) for c in CONTEXTS])
    lm.close()


def test_numpy_rows_are_served_while_another_thread_is_importing_torch(monkeypatch):
    """While a thread imports torch, ``sys.modules`` holds the half-made module, without
    ``Tensor`` yet: batches finishing on the worker then failed with AttributeError, every
    caller's numpy requests included. The half-made module is put in place here (torch may
    already be imported in this process)."""
    half_made = types.ModuleType("torch")
    monkeypatch.setitem(sys.modules, "torch", half_made)
    lm = MockLM(VOCAB)
    rows = lm.batch_next_token_logprobs_sync(CONTEXTS)
    np.testing.assert_array_equal(rows, [expected(c) for c in CONTEXTS])
    row = asyncio.run(lm.next_token_logprobs([1, 2]))
    np.testing.assert_array_equal(row, expected([1, 2]))
    lm.close()


def test_torch_output_equals_numpy_rows_and_never_aliases_the_cache():
    torch = pytest.importorskip("torch")
    lm = MockLM(VOCAB)
    row = lm.next_token_logprobs_sync(CONTEXTS[1], output="torch")
    assert isinstance(row, torch.Tensor) and row.dtype == torch.float32 and row.shape == (5,)
    np.testing.assert_array_equal(row.numpy(), expected(CONTEXTS[1]))
    row += 1.0  # the cached numpy row stays intact
    np.testing.assert_array_equal(lm.next_token_logprobs_sync(CONTEXTS[1]), expected(CONTEXTS[1]))

    async def both():
        return await asyncio.gather(
            lm.batch_next_token_logprobs(CONTEXTS, output="torch"),
            lm.next_token_logprobs(CONTEXTS[2], output="torch"),
        )

    batch, single = asyncio.run(both())
    assert batch.shape == (3, 5) and batch.dtype == torch.float32
    np.testing.assert_array_equal(batch.numpy(), [expected(c) for c in CONTEXTS])
    np.testing.assert_array_equal(single.numpy(), expected(CONTEXTS[2]))
    empty = lm.batch_next_token_logprobs_sync([], output="torch")
    assert isinstance(empty, torch.Tensor) and empty.shape == (0, 5)
    lm.close()


def test_backend_torch_rows_are_cached_as_torch_and_converted_for_numpy_callers():
    torch = pytest.importorskip("torch")
    lm = TorchMock(VOCAB)
    first = lm.next_token_logprobs_sync(CONTEXTS[0], output="torch")
    again = lm.next_token_logprobs_sync(CONTEXTS[0], output="torch")
    assert again is first  # served from the cache as the tensor itself: no copy
    assert len(lm.batches) == 1
    as_numpy = lm.next_token_logprobs_sync(CONTEXTS[0])
    assert isinstance(as_numpy, np.ndarray) and not as_numpy.flags.writeable
    np.testing.assert_array_equal(as_numpy, expected(CONTEXTS[0]))
    batch = asyncio.run(lm.batch_next_token_logprobs(CONTEXTS))
    assert isinstance(batch, np.ndarray) and batch.shape == (3, 5)
    np.testing.assert_array_equal(batch, [expected(c) for c in CONTEXTS])
    tbatch = lm.batch_next_token_logprobs_sync(CONTEXTS, output="torch")
    assert isinstance(tbatch, torch.Tensor)
    np.testing.assert_array_equal(tbatch.numpy(), batch)
    # the rows view their batches (one of 1 row, one of 2), each counted once; the cache
    # also counts each entry's key
    from genlm.core.backend import Request, key_nbytes

    keys = sum(key_nbytes(Request(None, tuple(c))) for c in CONTEXTS)
    assert lm.output_cache.nbytes == 3 * 5 * 4 + keys
    assert asyncio.run(lm.sample(CONTEXTS[0], max_tokens=3, seed=1))  # sampling reads numpy
    lm.close()


def test_backend_torch_rows_of_the_wrong_shape_are_rejected():
    pytest.importorskip("torch")

    class Short(MockLM):
        def _logprobs_batch(self, contexts, variant):
            import torch

            return torch.zeros((len(contexts), 2))

    lm = Short(VOCAB)
    with pytest.raises(RuntimeError, match="shape"):
        lm.next_token_logprobs_sync([0])
    lm.close()


@pytest.mark.parametrize("bad", ["nan", "logits"])
def test_backend_torch_rows_are_checked_like_numpy_rows(bad):
    """A torch batch holding NaN or raw logits fails with BackendError and is not cached."""
    torch = pytest.importorskip("torch")

    from genlm.core import BackendError

    class Bad(MockLM):
        def _logprobs_batch(self, contexts, variant):
            rows = torch.from_numpy(super()._logprobs_batch(contexts, variant)).clone()
            rows[-1, 0] = float("nan") if bad == "nan" else 3.0
            return rows

    lm = Bad(VOCAB)
    with pytest.raises(BackendError, match="NaN" if bad == "nan" else "raw logits"):
        lm.batch_next_token_logprobs_sync(CONTEXTS, output="torch")
    assert lm.output_cache.nbytes == 0
    lm.close()


def test_uncached_rows_are_computed_fresh_and_left_out_of_the_cache():
    """``next_token_logprobs_uncached`` runs the backend every time (a batch per call), never
    answers from the cache nor fills it, and checks its context like every request."""
    lm = MockLM(VOCAB)
    for _ in range(2):
        np.testing.assert_array_equal(
            lm.next_token_logprobs_uncached(CONTEXTS[2]), expected(CONTEXTS[2])
        )
    assert lm.batches == [[tuple(CONTEXTS[2])]] * 2
    assert lm.output_cache.get((None, tuple(CONTEXTS[2]))) is None
    lm.next_token_logprobs_sync(CONTEXTS[2])  # cached now, and computed for that
    assert len(lm.batches) == 3
    assert lm.output_cache.get((None, tuple(CONTEXTS[2]))) is not None  # the key's form
    lm.next_token_logprobs_uncached(CONTEXTS[2])
    assert len(lm.batches) == 4  # the cached row was not used
    with pytest.raises(InvalidContextError):
        lm.next_token_logprobs_uncached([])
    with pytest.raises(ValueError, match="output must be"):
        lm.next_token_logprobs_uncached([0], output="jax")
    lm.close()
