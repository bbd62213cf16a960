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


def test_a_lazy_package_is_checked_through_its_type_checking_mirror(tmp_path):
    """A package whose ``__all__`` griffe cannot read (made from ``_EXPORTS``) is checked by
    the names its ``TYPE_CHECKING`` block re-exports as ``X as X``; a plain import is not
    public."""
    package = tmp_path / "lazy_under_check"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """A lazy package."""
            from typing import TYPE_CHECKING
            _EXPORTS = {"bare": "_impl", "good": "_impl"}
            __all__ = list(_EXPORTS)
            if TYPE_CHECKING:
                from lazy_under_check._impl import bare as bare
                from lazy_under_check._impl import good as good
                from lazy_under_check._impl import hidden
            '''
        )
    )
    (package / "_impl.py").write_text(
        'def bare(): pass\ndef good():\n    """Documented."""\ndef hidden(): pass\n'
    )
    check = checker()
    module = griffe.load(
        "lazy_under_check",
        search_paths=[str(tmp_path)],
        extensions=griffe.load_extensions(*check.EXTENSIONS),
    )
    assert sorted(check.public_names(module)) == ["bare", "good"]
    assert check.check_module(module) == ["lazy_under_check.bare: no docstring"]
