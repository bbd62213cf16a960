"""Packaging promises: namespace layout, light imports, public names, embedded model."""

import hashlib
import importlib
from pathlib import Path

import pytest
from support.imports import modules_loaded_by, type_checking_imports

from genlm.core.backend import resolve_model_path, type_checking_exports

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "vllm", "mlx", "mlx_lm", "scipy", "numpy", "asyncio")


def test_no_genlm_init_anywhere():
    """`genlm` and `genlm.backends` stay PEP 420 namespaces: no __init__.py in them."""
    offenders = [
        p
        for pattern in ("*/src/genlm/__init__.py", "*/src/genlm/backends/__init__.py")
        for p in REPO.glob(pattern)
    ]
    assert offenders == []


@pytest.mark.parametrize("module", ["genlm.core", "genlm.core.backend"])
def test_import_is_light(module):
    """The user API and the backend authors' module import no torch, transformers, vllm or
    mlx (nor even numpy): a plugin module imports ``BackendSpec`` during discovery."""
    assert modules_loaded_by(f"import {module}", HEAVY) == []


@pytest.mark.parametrize("name", ["genlm.core", "genlm.core.backend"])
def test_all_lists_exactly_the_public_names(name):
    """``_EXPORTS`` is read from the static ``TYPE_CHECKING`` imports (what type checkers and
    the API reference read) and ``__all__`` made from it; every name resolves to the object
    its line names, and no other public name exists."""
    module = importlib.import_module(name)
    assert module.__all__ == list(module._EXPORTS)
    public = {
        n
        for n in dir(module)
        if not n.startswith("_") and not isinstance(getattr(module, n), type(module))
    }
    assert set(module.__all__) == public
    full = {n: (m if "." in m else f"genlm.core.{m}") for n, m in module._EXPORTS.items()}
    for n, m in full.items():
        assert getattr(module, n) is getattr(importlib.import_module(m), n)
    assert type_checking_imports(Path(module.__file__)) == full
    assert module.__version__ != "0+unknown"


def test_user_api_and_backend_api_are_disjoint():
    """A name has one home: the user API, or the backend authors' module."""
    import genlm.core
    import genlm.core.backend

    assert set(genlm.core.__all__).isdisjoint(genlm.core.backend.__all__)


def test_embedded_model_resolves_offline():
    """`stories260K` resolves to the bundled files, identical to the shared originals' hashes."""
    path = Path(resolve_model_path("stories260K"))
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    assert digest == "407a7c581bdd66972383ce9ad24857713fb98786d06ea564a2fe9b34ebe77dfd"
    assert (path / "NOTICE.md").read_text().count("MIT") >= 1
    assert resolve_model_path("org/some-model") == "org/some-model"


def test_type_checking_exports_reads_the_static_imports(tmp_path):
    """A lazy package's export list: each name maps to its module, in the lines' order; a
    file without the block is refused."""
    source = tmp_path / "pkg.py"
    source.write_text(
        "from typing import TYPE_CHECKING as _TYPE_CHECKING\n"
        "import os\n"
        "if _TYPE_CHECKING:\n"
        "    from b.mod import Z as Z, y as y\n"
        "    from a import X as X\n"
    )
    assert list(type_checking_exports(str(source)).items()) == [
        ("Z", "b.mod"),
        ("y", "b.mod"),
        ("X", "a"),
    ]
    source.write_text("import os\n")
    with pytest.raises(ValueError, match="no top-level `if TYPE_CHECKING:`"):
        type_checking_exports(str(source))


def test_core_oldest_pins_every_floor_of_genlm_cores_requirements():
    """The README's version policy: genlm-core's third-party ranges are tested at both ends,
    so the ``core(oldest)`` session (noxfile.py's ``CORE_ENDS[0]``, read statically) pins
    the floor of each requirement the pyproject declares, its ``test`` extra's included
    (what a plugin author's conformance run installs), and nothing else."""
    import ast
    import re
    import tomllib

    project = tomllib.loads((REPO / "genlm-core" / "pyproject.toml").read_text())["project"]
    floors = {}
    for requirement in project["dependencies"] + project["optional-dependencies"]["test"]:
        name, floor = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement).groups()
        floors[name.lower()] = tuple(map(int, floor.split(".")))
    [ends] = [
        node.value
        for node in ast.parse((REPO / "noxfile.py").read_text()).body
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == ["CORE_ENDS"]
    ]
    pins = {}
    for pin in ast.literal_eval(ends)[0]:
        name, version = pin.split("==")
        pins[name.lower()] = tuple(map(int, version.split(".")))
    assert pins.keys() == floors.keys()
    for name, version in pins.items():  # 1.26 is 1.26.0
        assert version == floors[name] + (0,) * (len(version) - len(floors[name])), name
