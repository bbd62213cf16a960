"""Fixtures for the genlm-bytes tests."""

import pytest
from support.bytes_lms import Float64Stories


@pytest.fixture(scope="session")
def stories64() -> Float64Stories:
    """stories260K in float64 (full forward), shared by the session: rows are cached."""
    return Float64Stories()
