"""No distribution uses another distribution's private names (issue 24 item 1).

Distributions are versioned apart, so one may rely only on what another declares public:
for backends, :mod:`genlm.core.backend`, :mod:`genlm.core.cli` and :mod:`genlm.core.hookspecs`
besides the user API in :mod:`genlm.core`. Read from the source with ``ast``, like
``tests/test_import_graph.py``, over every distribution under ``*/src/genlm/`` and the test
plugins under ``tests/plugins/*/src`` (they stand in for third-party backends):

* **imports**: ``import``/``from ... import`` of another distribution's module whose dotted
  path, or the name imported from it, has a part starting with ``_`` (``genlm.core._rows``,
  ``from genlm.core.cli import _load``), wherever the statement stands;
* **attributes**: ``x._name`` where ``_name`` is a private function, method, class or
  attribute that another distribution defines and this one does not (``lm._request(...)``
  on a core model, ``core_lm._adapters`` on an hf model). A backend overriding a core hook
  (``_logprobs_batch``, ``_variant``, ...) defines it, so calling it is its own business.

The attribute rule matches by name, not by type: it cannot see that ``x`` is another
distribution's object when this distribution defines a private name of the same spelling.
The test suite and benchmarks are not checked: a test may reach into the package it tests.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def distributions(root: Path) -> dict[str, dict[str, Path]]:
    """``distribution folder -> {module name: file}`` for every source tree under ``root``."""
    found: dict[str, dict[str, Path]] = {}
    for src in sorted([*root.glob("*/src"), *root.glob("tests/plugins/*/src")]):
        modules = {}
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
        if modules:
            found[str(src.parent.relative_to(root))] = modules
    return found


def _owner(dotted: str, owners: dict[str, str]) -> str | None:
    """The distribution of the longest known module prefix of ``dotted`` (None: not ours)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        owner = owners.get(".".join(parts[:n]))
        if owner is not None:
            return owner
    return None


def _imported(node: ast.Import | ast.ImportFrom, module: str, path: Path) -> list[str]:
    """The full dotted names an import statement reaches (module, or module.name)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join(parent + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]


def defined_private_names(modules: dict[str, Path]) -> set[str]:
    """Private names a distribution defines: functions, methods, classes, and attributes
    assigned as ``self._x``/``cls._x`` or as private module- or class-level names."""
    names: set[str] = set()
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if _is_private(n)}


def violations(root: Path) -> list[str]:
    """``path:line: what`` for every use of another distribution's private name."""
    dists = distributions(root)
    owners = {module: dist for dist, modules in dists.items() for module in modules}
    defined = {dist: defined_private_names(modules) for dist, modules in dists.items()}
    found = []
    for dist, modules in dists.items():
        foreign = set().union(*(names for d, names in defined.items() if d != dist))
        foreign -= defined[dist]
        for module, path in modules.items():
            where = path.relative_to(root)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    for target in _imported(node, module, path):
                        owner = _owner(target, owners)
                        if owner not in (None, dist) and any(map(_is_private, target.split("."))):
                            found.append(f"{where}:{node.lineno}: imports {target} ({owner})")
                elif isinstance(node, ast.Attribute) and node.attr in foreign:
                    found.append(
                        f"{where}:{node.lineno}: uses .{node.attr} of another distribution"
                    )
    return sorted(found)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")


def test_the_checker_sees_private_imports_and_attributes(tmp_path):
    """On a two-distribution tree, each kind of private use is reported and public or own
    uses are not."""
    _write(
        tmp_path,
        {
            "a/src/genlm/a/__init__.py": "from genlm.a._impl import Model\n",
            "a/src/genlm/a/_impl.py": (
                "class Model:\n"
                "    def _request(self, ids): return ids\n"
                "    def _hook(self): pass\n"
                "    def public(self):\n"
                "        self._state = 1\n"
                "        return self._request([1])\n"
            ),
            "b/src/genlm/b/__init__.py": "",
            "b/src/genlm/b/use.py": (
                "from genlm.a import Model\n"
                "from genlm.a._impl import Model as M\n"
                "from genlm.a import _impl\n"
                "from genlm.b import _own\n"
                "class Mine(Model):\n"
                "    def _hook(self): return super()._hook()\n"
                "    def go(self, other):\n"
                "        other._request([2])\n"
                "        return other._state, self._hook()\n"
            ),
            "b/src/genlm/b/_own.py": "",
        },
    )
    assert violations(tmp_path) == [
        "b/src/genlm/b/use.py:2: imports genlm.a._impl.Model (a)",
        "b/src/genlm/b/use.py:3: imports genlm.a._impl (a)",
        "b/src/genlm/b/use.py:8: uses ._request of another distribution",
        "b/src/genlm/b/use.py:9: uses ._state of another distribution",
    ]


def test_no_distribution_uses_another_distributions_private_names():
    """Plugins, genlm-bytes and the facade use only the declared public modules."""
    assert set(distributions(ROOT)) >= {"genlm-core", "genlm-bytes", "genlm-backend-hf"}
    assert violations(ROOT) == []
