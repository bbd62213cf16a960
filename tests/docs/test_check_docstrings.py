"""docs/check_docstrings.py flags exactly the undocumented public names of a package."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe", reason="the docs tools are installed by `nox -s docs`")

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "check_docstrings.py"


def checker():
    spec = importlib.util.spec_from_file_location("check_docstrings", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOURCE = '''
"""A package."""

__all__ = ["good", "bare", "summary_only", "Thing", "LIMIT", "UNDOCUMENTED", "_private_ok"]

LIMIT = 3
"""A documented constant."""

UNDOCUMENTED = 4


def good(x: int, *rest: int, **opts: str) -> int:
    """Documented.

    Args:
        x: a number.
        *rest: more numbers.
        **opts: options.

    Returns:
        A number.
    """


def bare(x: int) -> None:
    pass


def summary_only(x: int, y: int) -> int:
    """One line is enough: no Args or Returns section is demanded."""


def _private_ok():
    pass


class Thing:
    """A class.

    Args:
        size: documented in the class docstring.
    """

    def __init__(self, size: int, colour: str) -> None:
        pass

    def method(self) -> None:
        pass

    def documented(self, x: int) -> int:
        """One line."""

    @property
    def value(self) -> int:
        """A documented property."""

    @property
    def bare_value(self) -> int:
        return 1

    def _hidden(self):
        pass
'''


def test_flags_each_kind_of_gap(tmp_path):
    """Every public name, method and property without a docstring is reported; nothing else is."""
    (tmp_path / "pkg_under_check").mkdir()
    (tmp_path / "pkg_under_check" / "__init__.py").write_text(textwrap.dedent(SOURCE))
    module = griffe.load("pkg_under_check", search_paths=[str(tmp_path)])
    problems = checker().check_module(module)
    assert sorted(problems) == sorted(
        [
            "pkg_under_check.bare: no docstring",
            "pkg_under_check.UNDOCUMENTED: no docstring (add a string literal after it)",
            "pkg_under_check.Thing.method: no docstring",
            "pkg_under_check.Thing.bare_value: no docstring",
            "pkg_under_check._private_ok: no docstring",
        ]
    )
