"""Skip a backend's whole test folder, as a clean skip, when its libraries are missing.

``pytest.importorskip`` at the top of a folder's conftest skips the folder under
``pytest tests``, but under ``pytest tests/vllm`` that conftest is an *initial* conftest,
loaded before collection starts, where a skip is an error with a traceback. So a backend
folder's conftest imports nothing heavy at module level, asks :func:`missing`, and where
something is missing binds :func:`skip_every_module` as its
``pytest_pycollect_makemodule`` hook: each test module is then reported skipped, with the
reason, whichever way pytest was started.
"""

from __future__ import annotations

import importlib

import pytest


def missing(*modules: str) -> str | None:
    """The first of ``modules`` that does not import, or None when all do."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


class _SkippedModule(pytest.Module):
    """A test module that is skipped instead of imported (its imports would fail)."""

    reason = ""

    def collect(self):
        pytest.skip(self.reason)


def skip_every_module(reason: str):
    """A ``pytest_pycollect_makemodule`` hook that skips every test module of its folder."""

    def pytest_pycollect_makemodule(module_path, parent):
        module = _SkippedModule.from_parent(parent, path=module_path)
        module.reason = reason
        return module

    return pytest_pycollect_makemodule
