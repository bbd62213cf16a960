"""The vLLM backend passes core's AsyncLM conformance kit."""

from __future__ import annotations

import pytest

from genlm.core.testing import AsyncLMConformance


class TestVLLMConformance(AsyncLMConformance):
    #: vLLM chunks prompts differently with different batch mates; its CPU
    #: single-token attention path then moves rows by up to ~5e-4 (see
    #: test_vllm_logprobs.ATOL).
    atol = 1e-3

    @pytest.fixture(scope="class")
    def lm(self, vllm_lm):
        """The session's tiny-model engine."""
        vllm_lm.clear_lora()
        return vllm_lm
