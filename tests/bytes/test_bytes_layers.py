"""genlm-bytes' two layers (issue 24 item 2): the byte model, and over it the published
genlm-bytes 0.2 API (``genlm.bytes.byte_lm`` and ``genlm.bytes.trie``).

Read from the source with ``ast``, as ``tests/test_import_graph.py`` reads it: every import
statement counts, inside functions and under ``TYPE_CHECKING`` too. The model's modules
never import the 0.2 layer, by module or by one of its names from the package, and no
module of genlm-bytes knows the ``genlm.backend`` facade (its ``core_lm`` attribute).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "genlm-bytes" / "src" / "genlm" / "bytes"
#: The 0.2 layer's modules (``byte_lm`` is a package).
LAYER = ("genlm.bytes.byte_lm", "genlm.bytes.trie")
#: The names the package exports from the 0.2 layer.
LAYER_NAMES = {
    "AsyncEosModeTrie",
    "AsyncTokenByteTrie",
    "BeamParams",
    "ByteBeamState",
    "EosModeTrie",
    "LazyTrieState",
    "StatefulTokenizedLM",
    "TokenByteTrie",
    "TrieMode",
}


def module_name(path: Path) -> str:
    parts = ["genlm", "bytes", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def in_layer(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in LAYER)


def imports(source: str, name: str, is_package: bool = False) -> set[str]:
    """What the module ``name`` (``source``) imports: modules, and ``package.name`` for each
    ``from package import name`` (relative imports resolved)."""
    package = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            stem = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            out.add(stem)
            out.update(f"{stem}.{alias.name}" for alias in node.names)
    return out


def violations(source: str, name: str) -> list[str]:
    """The imports by which the module ``name`` would reach the 0.2 layer."""
    found = []
    for target in sorted(imports(source, name)):
        stem, _, last = target.rpartition(".")
        if in_layer(target) or (stem == "genlm.bytes" and last in LAYER_NAMES):
            found.append(target)
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))
MODEL = [p for p in MODULES if not in_layer(module_name(p)) and p.name != "__init__.py"]


def test_the_reader_sees_the_layers():
    """The checker itself: the layer is told apart from the model, and each way a model
    module could reach the layer is caught (module, exported name, relative, deferred)."""
    model = {module_name(p) for p in MODEL}
    assert {"genlm.bytes._beam", "genlm.bytes._bytelm", "genlm.bytes._model"} <= model
    assert not {"genlm.bytes.trie", "genlm.bytes.byte_lm.beam"} & model
    beam = (PACKAGE / "byte_lm" / "beam.py").read_text()
    assert "genlm.bytes._beam.BeamState" in imports(beam, "genlm.bytes.byte_lm.beam")
    name = "genlm.bytes._beam"
    assert violations("from genlm.bytes import ByteLM, EOS", name) == []
    assert violations("from genlm.bytes import ByteBeamState", name) == [
        "genlm.bytes.ByteBeamState"
    ]
    assert violations("import genlm.bytes.trie", name) == ["genlm.bytes.trie"]
    assert violations("def f():\n    from .byte_lm import beam", name) == [
        "genlm.bytes.byte_lm",
        "genlm.bytes.byte_lm.beam",
    ]


@pytest.mark.parametrize("path", MODEL, ids=lambda p: module_name(p))
def test_the_model_never_imports_the_0_2_layer(path):
    """Each module of the byte model imports nothing of the 0.2 layer."""
    assert violations(path.read_text(encoding="utf-8"), module_name(path)) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_nothing_looks_for_the_facade(path):
    """No module of genlm-bytes reads ``core_lm``: the facade's models are ``AsyncLM``s."""
    nodes = list(ast.walk(ast.parse(path.read_text(encoding="utf-8"))))
    names = {n.attr for n in nodes if isinstance(n, ast.Attribute)}
    names |= {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not any("core_lm" in n for n in names)
