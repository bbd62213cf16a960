"""The mock backend passes the conformance kit that every backend runs."""

import pytest

from genlm.core.mock import MockLM
from genlm.core.testing import AsyncLMConformance

#: Two mock models: a vocabulary with multi-byte and duplicate tokens behind a short delay,
#: and a small one without an output cache, so every request reaches the backend.
MOCKS = {
    "cached": (
        [bytes([b]) for b in range(256)] + [b"ab", b"the", b" the", b"ab"],
        {"latency_s": 0.001},
    ),
    "no-cache": ([b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"], {"cache_bytes": 0}),
}


class TestMockConformance(AsyncLMConformance):
    @pytest.fixture(scope="class", params=list(MOCKS.values()), ids=list(MOCKS))
    @classmethod
    def lm(cls, request):
        vocab, options = request.param
        model = MockLM(vocab, **options)
        yield model
        model.close()
