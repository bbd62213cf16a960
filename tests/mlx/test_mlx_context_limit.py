"""The mlx backend rejects contexts longer than the model's maximum positions, on the caller's
side: stories260K has ``max_position_embeddings=512``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from genlm.backends.mlx import MLXLM
from genlm.backends.mlx._model import _max_positions
from genlm.core import InvalidContextError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-4  # both fp32 (see test_mlx_logprobs)


@pytest.fixture(scope="module")
def lm(stories_dir):
    model = MLXLM.from_name(stories_dir, cache_bytes=0, max_wait_s=0.05)
    yield model
    model.close()


@pytest.fixture(scope="module")
def reference(stories_dir):
    """transformers' plain full forward: log_softmax of the last position's logits."""
    model = transformers.AutoModelForCausalLM.from_pretrained(stories_dir).float().eval()

    def logprobs(context):
        with torch.no_grad():
            logits = model(torch.tensor([list(context)])).logits[0, -1].double()
        return torch.log_softmax(logits, -1).numpy()

    return logprobs


def context(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 512, size=n)]


def test_limit_is_read_from_the_model_arguments(lm):
    """max_position_embeddings (Llama), n_positions (GPT-2), or none."""
    assert lm.max_context_length == 512
    assert _max_positions([SimpleNamespace(n_positions=1024, n_ctx=1024)]) == 1024
    assert _max_positions([SimpleNamespace(max_position_embeddings=None)]) is None
    assert _max_positions([]) is None


def test_512_tokens_run_and_513_are_rejected(lm, reference):
    """The longest allowed context gives the reference row; one token more raises."""
    longest = context(512, seed=0)
    row = lm.next_token_logprobs_sync(longest)
    np.testing.assert_allclose(row, reference(longest), atol=ATOL)
    with pytest.raises(InvalidContextError, match=r"513 tokens.*maximum of 512"):
        lm.next_token_logprobs_sync(longest + [5])


def test_one_long_request_does_not_fail_its_batch_mates(lm, reference):
    """Concurrent requests: the too-long one raises, the others get their rows."""
    contexts = [context(7, seed=1), context(600, seed=2), context(300, seed=3)]

    async def together():
        return await asyncio.gather(
            *(lm.next_token_logprobs(c) for c in contexts), return_exceptions=True
        )

    results = asyncio.run(together())
    assert isinstance(results[1], InvalidContextError)
    for i in (0, 2):
        np.testing.assert_allclose(results[i], reference(contexts[i]), atol=ATOL)
