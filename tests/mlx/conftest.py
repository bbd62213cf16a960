"""Fixtures for the mlx backend tests: MLX imports only after the skip checks."""

from __future__ import annotations

import pytest
from support.backend_guard import missing, skip_every_module

if absent := missing("mlx.core", "mlx_lm"):
    pytest_pycollect_makemodule = skip_every_module(
        f"{absent} is not importable (pip install 'mlx[cpu]' mlx-lm on Linux)"
    )


@pytest.fixture(scope="session")
def stories_dir() -> str:
    """The embedded stories260K model directory."""
    from genlm.core.backend import resolve_model_path

    return resolve_model_path("stories260K")


def _random_llama_dir(preset: str) -> str:
    """The directory of a random-weight Llama preset, built once per machine (needs torch)."""
    pytest.importorskip("torch")
    from support.random_llama import cached_random_llama

    return str(cached_random_llama(preset))


@pytest.fixture(scope="session")
def tiny_dir() -> str:
    """A random-weight Llama (hidden 128, 2 layers, GPT-2 tokenizer), initializer range 0.5.

    Its rows span tens of nats, but it is ill-conditioned: on some contexts its fp32 forward
    is up to 9e-4 off its fp64 forward, so fp32 results on it carry that much round-off.
    """
    return _random_llama_dir("tiny")


@pytest.fixture(scope="session")
def tiny_mild_dir() -> str:
    """``tiny`` with initializer range 0.1: fp32 round-off below 1e-5, so fit for a plain 1e-4."""
    return _random_llama_dir("tiny_mild")
