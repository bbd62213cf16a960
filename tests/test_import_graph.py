"""No import circles among the modules of one distribution (issue 17 item 4).

The graph is read from the source with ``ast``, not by importing: every ``import`` and
``from ... import`` statement of every module under ``*/src/genlm/`` is an edge,
wherever it stands. Imports inside functions and under ``if TYPE_CHECKING:`` count too:
a deferred or type-only import is still a dependency between the two modules, and
moving one side of a circle into a function (or behind ``TYPE_CHECKING``) is how a
circle hides, not how it goes away. A shared type belongs in a module both sides import.

Only edges within one distribution are checked (a plugin importing its host's package is
the point of a plugin). ``from package import name`` is an edge to the submodule
``package.name`` when there is one, else to the package's ``__init__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


#: Files that are modules: Python source, and C extensions (as source or built), which
#: import no module of the project.
_MODULE_SUFFIXES = (".py", ".c", ".so", ".pyd")


def _modules() -> dict[str, tuple[str, Path]]:
    """``module name -> (distribution folder, file)`` for every module under ``*/src/genlm``."""
    found: dict[str, tuple[str, Path]] = {}
    for src in sorted(ROOT.glob("*/src")):
        if not (src / "genlm").is_dir():
            continue
        for path in sorted((src / "genlm").rglob("*")):
            if path.suffix not in _MODULE_SUFFIXES or "__pycache__" in path.parts:
                continue
            # A built extension is named like _trie_kernel.cpython-311-x86_64-linux-gnu.so.
            parts = list(path.relative_to(src).parts)
            parts[-1] = parts[-1].split(".")[0]
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if path.suffix == ".py" or name not in found:
                found[name] = (src.parent.name, path)
    return found


def _targets(name: str, path: Path, known: set[str]) -> set[str]:
    """The known modules that the module ``name`` (file ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.add(_longest_known(alias.name, known))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for alias in node.names:
                sub = f"{stem}.{alias.name}"
                out.add(sub if sub in known else _longest_known(stem, known))
    out.discard("")
    out.discard(name)
    return out


def _longest_known(dotted: str, known: set[str]) -> str:
    """The longest prefix of ``dotted`` that is a known module ('' if none)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in known:
            return candidate
    return ""


def import_graph() -> dict[str, set[str]]:
    """``module -> modules of the same distribution it imports``."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, (dist, path) in modules.items():
        targets = _targets(name, path, known) if path.suffix == ".py" else set()
        graph[name] = {t for t in targets if modules[t][0] == dist}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One list per strongly connected component with a circle (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_find_cycles_sees_a_circle_and_a_clean_graph():
    """The checker itself: a circle through three modules is found, a chain is not."""
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_sees_deferred_and_type_only_imports():
    """The byte modules' known edges are read, including ones inside functions."""
    graph = import_graph()
    assert "genlm.bytes._types" in graph["genlm.bytes._beam"]
    assert "genlm.bytes._beam" in graph["genlm.bytes._bytelm"]  # imported inside initial()
    assert "genlm.core._trie" in graph["genlm.core._async_trie"]


# genlm-core's plugin contract imports the CLI's ``Command``
# (_registry -> hookspecs -> cli -> _registry); the `plugins` helper removes it.
# Lead: drop this mark once that fix is merged.
KNOWN_CORE_CYCLE = pytest.mark.xfail(
    reason="known genlm-core circle _registry -> hookspecs -> cli (issue 17 item 4)", strict=False
)


@pytest.mark.parametrize(
    "distribution",
    [
        pytest.param(d, marks=KNOWN_CORE_CYCLE) if d == "genlm-core" else d
        for d in sorted({dist for dist, _ in _modules().values()})
    ],
)
def test_no_import_circle_within_a_distribution(distribution):
    """Every distribution's modules import each other without a circle."""
    modules = _modules()
    graph = {m: t for m, t in import_graph().items() if modules[m][0] == distribution}
    assert find_cycles(graph) == []
