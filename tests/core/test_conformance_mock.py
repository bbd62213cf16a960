"""The mock backend passes the conformance kit that every backend runs."""

import pytest

from genlm.core.mock import MockLM
from genlm.core.testing import AsyncLMConformance

#: Three mock models: a vocabulary with multi-byte and duplicate tokens behind a short
#: delay, a small one without an output cache, so every request reaches the backend, and the
#: mock backend's own loader over stories260K (its EOS token and, with tokenizers installed,
#: its tokenizer).
MOCKS = {
    "cached": lambda: MockLM(
        [bytes([b]) for b in range(256)] + [b"ab", b"the", b" the", b"ab"], latency_s=0.001
    ),
    "no-cache": lambda: MockLM([b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"], cache_bytes=0),
    "stories260K": lambda: MockLM.from_name("stories260K"),
}


class TestMockConformance(AsyncLMConformance):
    @pytest.fixture(scope="class", params=list(MOCKS.values()), ids=list(MOCKS))
    @classmethod
    def lm(cls, request):
        model = request.param()
        yield model
        model.close()

    @pytest.fixture(scope="class", params=list(MOCKS.values()), ids=list(MOCKS))
    @classmethod
    def make_lm(cls, request):
        """Each mock, made anew for each close check."""
        return request.param
