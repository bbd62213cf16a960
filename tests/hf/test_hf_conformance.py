"""The hf backend passes genlm-core's conformance kit."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from genlm.backends.hf import HFLM  # noqa: E402
from genlm.core.testing import AsyncLMConformance  # noqa: E402

#: HFLM options per run: the defaults, and one where every request reaches the backend
#: (no output cache) and a 4 KiB KV budget keeps evicting.
OPTIONS = {"default": {}, "no-output-cache-tiny-kv": {"cache_bytes": 0, "kv_cache_bytes": 4096}}


class TestHFConformance(AsyncLMConformance):
    @pytest.fixture(scope="class", params=list(OPTIONS.values()), ids=list(OPTIONS))
    @classmethod
    def lm(cls, request):
        model = HFLM.from_name("stories260K", **request.param)
        yield model
        model.close()

    @pytest.fixture(scope="class")
    @classmethod
    def make_lm(cls):
        """stories260K with the default options, loaded anew for each close check."""
        return lambda: HFLM.from_name("stories260K")
