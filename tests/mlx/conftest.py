"""Fixtures for the mlx backend tests: MLX imports only after the skip checks."""

from __future__ import annotations

import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")


@pytest.fixture(scope="session")
def stories_dir() -> str:
    """The embedded stories260K model directory."""
    from genlm.core import resolve_model_path

    return resolve_model_path("stories260K")


@pytest.fixture(scope="session")
def tiny_dir() -> str:
    """A random-weight Llama (hidden 128, 2 layers, GPT-2 tokenizer); building it needs torch."""
    pytest.importorskip("torch")
    from support.random_llama import cached_random_llama

    return str(cached_random_llama("tiny"))
