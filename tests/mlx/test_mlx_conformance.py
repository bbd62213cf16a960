"""The core conformance kit, run on the mlx backend with stories260K."""

from __future__ import annotations

import pytest

from genlm.core.testing import AsyncLMConformance


class TestMLXConformance(AsyncLMConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def lm(cls):
        """stories260K loaded through the registry with ``backend="mlx"``."""
        from genlm.core import load_model_by_name

        model = load_model_by_name("stories260K", backend="mlx")
        yield model
        model.close()

    @pytest.fixture(scope="class")
    @classmethod
    def make_lm(cls):
        """stories260K, loaded anew through the registry for each close check."""
        from genlm.core import load_model_by_name

        return lambda: load_model_by_name("stories260K", backend="mlx")
