"""Every ``from genlm.X import name`` in the tree names something genlm.X has.

The lazy packages (``genlm.core``, ``genlm.core.backend``, ``genlm.bytes``, ...) resolve their
names on first use, so a name moved from one module to another (as machinery moved from
``genlm.core`` to ``genlm.core.backend``) fails only when the importing code runs: in a
benchmark, a CLI branch, a test of another session. This reads every import statically,
like ``tests/test_import_graph.py``, and checks it against what the target module defines:
its top-level names, the keys of its ``_EXPORTS`` (the lazy exports), and its submodules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules(root: Path) -> dict[str, Path]:
    """``module name -> file`` for every ``genlm.*`` module of the distributions under ``root``
    (a C extension by its source, ``_trie_kernel.c``: it defines no Python names to check)."""
    found = {}
    for src in [*root.glob("*/src"), *root.glob("tests/plugins/*/src")]:
        for path in [*src.rglob("*.py"), *src.rglob("*.c")]:
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if parts and parts[0] == "genlm":
                found[".".join(parts)] = path
    return found


def top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run at module level: ``body`` and the blocks of its ``if``, ``try``,
    ``with`` and loops, not the bodies of functions and classes."""
    for node in body:
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                yield from top_level([child])
            elif isinstance(child, ast.ExceptHandler):
                yield from top_level(child.body)


def defined_names(tree: ast.Module) -> set[str]:
    """Names a module defines at top level (under ``if TYPE_CHECKING`` too) or exports lazily."""
    names: set[str] = set()
    for node in top_level(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names.add(leaf.id)
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)
                and isinstance(node.value, ast.Dict)
            ):
                names.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return names


def missing_imports(root: Path, files: list[Path]) -> list[str]:
    """``file:line: from M import name`` for each imported name M does not have."""
    known = modules(root)
    defined = {
        name: defined_names(ast.parse(path.read_text()))
        for name, path in known.items()
        if path.suffix == ".py"
    }
    problems = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module not in defined:
                continue
            for alias in node.names:
                name = alias.name
                if name == "*" or name in defined[node.module]:
                    continue
                if f"{node.module}.{name}" in known:  # a submodule
                    continue
                where = path.relative_to(root)
                problems.append(f"{where}:{node.lineno}: from {node.module} import {name}")
    return problems


def python_files(root: Path) -> list[Path]:
    """The sources, tests, benchmarks and docs scripts of the tree (no build output)."""
    files = [
        *root.glob("*/src/**/*.py"),
        *root.glob("tests/**/*.py"),
        *root.glob("benchmarks/**/*.py"),
        *root.glob("docs/**/*.py"),
    ]
    return sorted(f for f in files if not any(p.startswith(".") for p in f.parts))


def test_every_imported_genlm_name_exists():
    """No import in the tree names something its genlm module does not define or export."""
    assert missing_imports(ROOT, python_files(ROOT)) == []


def test_the_check_sees_a_name_that_moved(tmp_path):
    """A name imported from a lazy package that no longer exports it is reported; a
    lazily exported name, a top-level name and a submodule are not."""
    pkg = tmp_path / "dist" / "src" / "genlm" / "thing"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        '_EXPORTS = {"Lazy": "_impl"}\nLOCAL = 1\n'
        "def f():\n    from os import sep as inner\n    hidden = 1\n"
    )
    (pkg / "_impl.py").write_text("class Lazy: ...\n")
    user = tmp_path / "benchmarks" / "use.py"
    user.parent.mkdir()
    user.write_text(
        "from genlm.thing import Lazy, LOCAL, _impl\nfrom genlm.thing import Moved\n"
        "from genlm.thing import hidden, inner\n"
    )
    assert missing_imports(tmp_path, [user]) == [
        "benchmarks/use.py:2: from genlm.thing import Moved",
        "benchmarks/use.py:3: from genlm.thing import hidden",
        "benchmarks/use.py:3: from genlm.thing import inner",
    ]
