"""The mock backend passes the conformance kit that every backend runs."""

import pytest

from genlm.core.mock import MockLM
from genlm.core.testing import AsyncLMConformance


class TestMockConformance(AsyncLMConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def lm(cls):
        vocab = [bytes([b]) for b in range(256)] + [b"ab", b"the", b" the", b"ab"]
        model = MockLM(vocab, latency_s=0.001)
        yield model
        model.close()


class TestMockConformanceNoCache(AsyncLMConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def lm(cls):
        model = MockLM([b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"], cache_bytes=0)
        yield model
        model.close()
