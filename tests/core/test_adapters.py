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
