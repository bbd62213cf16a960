"""Lazy public facades: a package's names import their modules on first use.

Plugin discovery imports every GenLM package's plugin module, and importing a module
runs its package's ``__init__``; a facade that imported numpy or torch there would slow
every ``genlm`` command. Packages build their ``__getattr__`` and ``__dir__`` here.

A package states its public names once, as ``from M import X as X`` lines under
``if TYPE_CHECKING:``: type checkers and the API reference (griffe) read those lines
statically, and :func:`type_checking_exports` reads them for the lazy ``__getattr__``.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, distribution: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of a lazy package.

    ``exports`` maps each public name to the module defining it, a submodule of
    ``package`` (``"_model"``) or a full module name (``"genlm.core._model"``);
    ``distribution`` gives ``__version__``. Use at the package's top level:
    ``__getattr__, __dir__ = lazy_exports(__name__, "my-dist", _EXPORTS)``.
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name == "__version__":
            from importlib.metadata import PackageNotFoundError, version

            try:
                return version(distribution)
            except PackageNotFoundError:  # running from a source tree
                return "0+unknown"
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if "." not in module:
            module = f"{package}.{module}"
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports) | {"__version__"})

    return __getattr__, __dir__


def type_checking_exports(path: str) -> dict[str, str]:
    """``name -> module`` of the ``from M import X as X`` lines under the top-level
    ``if TYPE_CHECKING:`` of the module at ``path`` (pass ``__file__``), in their order.

    Use at the package's top level, before :func:`lazy_exports`:
    ``_EXPORTS = type_checking_exports(__file__)``. Like scientific Python's
    ``lazy_loader.attach_stub``, it reads the package's own source, which wheels and
    sdists ship (about 0.5 ms a package, ``ast`` included).
    """
    with open(path, encoding="utf-8") as source:
        tree = ast.parse(source.read(), path)
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name):
            if node.test.id.lstrip("_") == "TYPE_CHECKING":
                return {
                    alias.asname or alias.name: statement.module
                    for statement in node.body
                    if isinstance(statement, ast.ImportFrom) and statement.module
                    for alias in statement.names
                }
    raise ValueError(f"{path} has no top-level `if TYPE_CHECKING:` block of exports")
