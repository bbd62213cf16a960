"""The vLLM backend passes core's AsyncLM conformance kit: its close checks in a process of
their own, the other checks on the session's engine."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from genlm.core.testing import AsyncLMConformance

from .conftest import ENGINE_OPTS_NO_LORA


class TestVLLMConformance(AsyncLMConformance):
    #: vLLM chunks prompts differently with different batch mates, which moves fp32 rows
    #: slightly; on the well-conditioned test model they stay well within 1e-4.
    atol = 1e-4

    @pytest.fixture(scope="class")
    @classmethod
    def lm(cls, vllm_lm):
        """The session's tiny-model engine."""
        vllm_lm.clear_lora()
        return vllm_lm

    @pytest.fixture(scope="class")
    @classmethod
    def make_lm(cls):
        """None here: the session's engine is open, and vLLM runs one in-process engine at
        a time; :func:`test_the_close_checks_pass_in_a_process_of_their_own` runs them."""
        pytest.skip("run by test_the_close_checks_pass_in_a_process_of_their_own")


#: The child's test module (after the lines that set ``MODEL`` and ``ENGINE_OPTS``): the
#: kit with its close checks alone, each on a new engine.
CLOSE_CHECKS = textwrap.dedent(
    """
    import pytest

    from genlm.backends.vllm import VLLMLM
    from genlm.core.testing import AsyncLMConformance


    class TestVLLMClose(AsyncLMConformance):
        @pytest.fixture(scope="class")
        @classmethod
        def lm(cls):
            pytest.skip("checked on the session's engine, in the parent process")

        @pytest.fixture(scope="class")
        @classmethod
        def make_lm(cls):
            return lambda: VLLMLM.from_name(MODEL, engine_opts=ENGINE_OPTS)
    """
)


def test_the_close_checks_pass_in_a_process_of_their_own(tiny_path, tmp_path):
    """The kit's close checks pass on in-process engines of the tiny model, one engine per
    check, each closed before the next starts (a child pytest: the session's engine is
    open here). They include vLLM's own generation (unseeded sampling) in flight."""
    module = tmp_path / "test_vllm_close_checks.py"
    settings = f"MODEL = {str(tiny_path)!r}\nENGINE_OPTS = {ENGINE_OPTS_NO_LORA!r}\n"
    module.write_text(settings + CLOSE_CHECKS)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-c", os.devnull]
        + ["--rootdir", str(tmp_path), str(module)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0 and "\n3 passed" in run.stdout, (
        run.stdout[-6000:] + run.stderr[-3000:]
    )
