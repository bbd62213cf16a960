"""The hf backend passes genlm-core's conformance kit."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from genlm.backends.hf import HFLM  # noqa: E402
from genlm.core.testing import AsyncLMConformance  # noqa: E402


class TestHFConformance(AsyncLMConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def lm(cls):
        model = HFLM.from_name("stories260K")
        yield model
        model.close()


class TestHFConformanceNoOutputCacheTinyKV(AsyncLMConformance):
    """Every request reaches the backend, and a 4 KiB KV budget keeps evicting."""

    @pytest.fixture(scope="class")
    @classmethod
    def lm(cls):
        model = HFLM.from_name("stories260K", cache_bytes=0, kv_cache_bytes=4096)
        yield model
        model.close()
