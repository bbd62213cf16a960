"""``LoraAdapters``: named adapters as request variants, on a toy backend.

The toy adapter rolls the mock's row by its value (still normalized), so a row under an
adapter is checked against ``np.roll`` of the mock's own row.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support.rolled import RolledLM

from genlm.core import UnknownVariantError
from genlm.core.backend import LoraAdapters
from genlm.core.mock import MockLM, mock_logprobs

VOCAB = [bytes([b]) for b in range(16)]
CONTEXT = [1, 2, 3]


def rolled(context, shift: int = 0) -> np.ndarray:
    return np.roll(mock_logprobs(context, len(VOCAB)), shift)


@pytest.fixture
def lm():
    model = RolledLM(VOCAB)
    yield model
    model.close()


def test_rows_follow_the_adapter_of_each_request(lm):
    """``variant=`` names an adapter per request; ``set_lora`` sets the default of later
    requests and ``clear_lora`` restores the base model; names list in loading order."""
    lm.add_lora(3, "b")
    lm.add_lora(5, "a")
    assert lm.loaded_loras == ("b", "a") and lm.active_lora is None
    np.testing.assert_allclose(lm.next_token_logprobs_sync(CONTEXT), rolled(CONTEXT), rtol=1e-6)
    np.testing.assert_allclose(
        lm.next_token_logprobs_sync(CONTEXT, variant="a"), rolled(CONTEXT, 5), rtol=1e-6
    )
    lm.set_lora("b")
    assert lm.active_lora == "b"
    np.testing.assert_allclose(lm.next_token_logprobs_sync(CONTEXT), rolled(CONTEXT, 3), rtol=1e-6)
    lm.clear_lora()
    np.testing.assert_allclose(lm.next_token_logprobs_sync(CONTEXT), rolled(CONTEXT), rtol=1e-6)


def test_current_variant_is_what_a_request_made_now_uses(lm):
    """``current_variant`` follows ``set_lora`` and ``clear_lora`` (what layers caching
    derived values key them by), and a closed model refuses to say."""
    from genlm.core import ModelClosedError

    lm.add_lora(3, "b")
    assert lm.current_variant is None
    lm.set_lora("b")
    assert lm.current_variant == "b"
    lm.clear_lora()
    assert lm.current_variant is None
    lm.close()
    with pytest.raises(ModelClosedError):
        _ = lm.current_variant


def test_bad_names_name_the_problem(lm):
    """An adapter loaded twice is a ValueError; an unknown one, for set_lora, remove_lora
    or a request, an UnknownVariantError listing the loaded ones."""
    lm.add_lora(1, "x")
    with pytest.raises(ValueError, match="'x' is already loaded"):
        lm.add_lora(2, "x")
    for call in (lm.set_lora, lm.remove_lora):
        with pytest.raises(UnknownVariantError, match=r"'nope'; loaded: \['x'\]"):
            call("nope")
    with pytest.raises(UnknownVariantError, match="'nope'"):
        lm.next_token_logprobs_sync(CONTEXT, variant="nope")
    with pytest.raises(TypeError, match="None names the base model"):
        lm.add_lora(3, None)
    with pytest.raises(TypeError, match="is a string, got 0"):
        lm.add_lora(3, 0)
    with pytest.raises(ValueError, match="must not be empty"):
        lm.add_lora(3, "")
    assert lm.loaded_loras == ("x",)


def test_removal_fails_queued_requests_and_a_name_loaded_again_serves_its_new_value(lm):
    """``remove_lora`` releases the adapter once, makes the base model active if it was,
    fails a request for it queued before (its batch not yet run), and clears the cached
    rows, so the name loaded again with another value serves that value's rows."""
    lm.add_lora(2, "x")
    lm.set_lora("x")
    np.testing.assert_allclose(lm.next_token_logprobs_sync(CONTEXT), rolled(CONTEXT, 2), rtol=1e-6)

    async def removed_while_queued():
        queued = asyncio.ensure_future(lm.next_token_logprobs([4, 5], variant="x"))
        await asyncio.sleep(0)  # queued; its batch's flush is scheduled, not yet run
        lm.remove_lora("x")
        with pytest.raises(UnknownVariantError, match="'x' was removed before this request"):
            await queued

    asyncio.run(removed_while_queued())
    assert lm.released == [("x", 2)] and lm.active_lora is None and lm.loaded_loras == ()
    lm.add_lora(7, "x")
    np.testing.assert_allclose(
        lm.next_token_logprobs_sync(CONTEXT, variant="x"), rolled(CONTEXT, 7), rtol=1e-6
    )


class NothingKeptLM(LoraAdapters, MockLM):
    """A backend that keeps nothing per adapter (its value is None) and rows as the mock's."""

    def __init__(self) -> None:
        super().__init__(VOCAB)
        self.released: list[str] = []

    def _release_adapter(self, name: str, value: None) -> None:
        self.released.append(name)


def test_an_adapter_whose_value_is_none_is_removed_like_any_other():
    """A backend may store None for an adapter: removing the active one releases it and
    makes the base model active (None was taken for "not loaded": the removed name stayed
    active and every later default request failed)."""
    lm = NothingKeptLM()
    try:
        lm.adapters.add("x", None)
        lm.set_lora("x")
        lm.remove_lora("x")
        assert lm.released == ["x"] and lm.active_lora is None and lm.loaded_loras == ()
        np.testing.assert_allclose(lm.next_token_logprobs_sync(CONTEXT), rolled(CONTEXT), rtol=1e-6)
        with pytest.raises(UnknownVariantError, match="clear_lora"):
            lm.set_lora(None)
    finally:
        lm.close()


def test_replace_keeps_the_old_adapter_until_the_new_one_has_loaded():
    """``add_lora(..., replace=True)`` over a loaded name: a load that fails leaves the
    old adapter loaded, active and serving (nothing released); one that loads takes the
    name (still active, now the last loaded), a request queued before the swap and the
    cached rows follow the new adapter, and the old one is released once."""
    lm = RolledLM(VOCAB)  # output cache on: a stale row would be served from it
    try:
        lm.add_lora(2, "x")
        lm.add_lora(3, "y")
        lm.set_lora("x")
        np.testing.assert_allclose(lm.next_token_logprobs_sync(CONTEXT), rolled(CONTEXT, 2))
        with pytest.raises(FileNotFoundError, match="no adapter at 'nowhere'"):
            lm.add_lora("nowhere", "x", replace=True)
        assert lm.loaded_loras == ("x", "y") and lm.active_lora == "x" and lm.released == []
        np.testing.assert_allclose(lm.next_token_logprobs_sync(CONTEXT), rolled(CONTEXT, 2))

        async def replaced_while_queued():
            queued = asyncio.ensure_future(lm.next_token_logprobs([4, 5]))
            await asyncio.sleep(0)  # queued under "x"; its batch's flush not yet run
            lm.add_lora(7, "x", replace=True)
            return await queued

        np.testing.assert_allclose(asyncio.run(replaced_while_queued()), rolled([4, 5], 7))
        assert lm.loaded_loras == ("y", "x") and lm.active_lora == "x"
        assert lm.released == [("x", 2)]
        np.testing.assert_allclose(lm.next_token_logprobs_sync(CONTEXT), rolled(CONTEXT, 7))
        lm.add_lora(1, "z", replace=True)  # nothing to replace: an ordinary load
        assert lm.loaded_loras == ("y", "x", "z") and lm.released == [("x", 2)]
    finally:
        lm.close()


class FailingCloseLM(RolledLM):
    """A RolledLM whose backend release fails."""

    def _close_backend(self) -> None:
        raise RuntimeError("release failed")


@pytest.mark.parametrize("model", [RolledLM, FailingCloseLM])
def test_close_forgets_the_adapters_and_adapter_calls_then_raise(model):
    """A closed model serves no adapter: none is listed or active (they were, and
    set_lora/clear_lora still changed the active one), also when the backend's release
    failed, and the adapter calls raise ModelClosedError, as every call does."""
    from genlm.core import ModelClosedError

    lm = model(VOCAB)
    lm.add_lora(2, "x")
    lm.add_lora(3, "y")
    lm.set_lora("x")
    if model is FailingCloseLM:
        with pytest.raises(RuntimeError, match="release failed"):
            lm.close()
    else:
        lm.close()
    assert lm.loaded_loras == () and lm.active_lora is None
    calls = [
        lambda: lm.set_lora("y"),
        lm.clear_lora,
        lambda: lm.remove_lora("x"),
        lambda: lm.add_lora(5, "z"),
        lambda: lm.add_lora(5, "x", replace=True),
    ]
    for call in calls:
        with pytest.raises(ModelClosedError, match="is closed"):
            call()
    assert lm.loaded_loras == () and lm.released == []
