"""Packaging promises: namespace layout, light imports, public names, embedded model."""

import hashlib
from pathlib import Path

from support.imports import modules_loaded_by

import genlm.core
from genlm.core import resolve_model_path

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


def test_import_is_light():
    """`import genlm.core` imports no torch, transformers, vllm or mlx (nor even numpy)."""
    assert modules_loaded_by("import genlm.core", HEAVY) == []


def test_all_lists_exactly_the_public_names():
    """Every name in `genlm.core.__all__` resolves, and no other public name exists."""
    for name in genlm.core.__all__:
        assert getattr(genlm.core, name) is not None
    public = {
        name
        for name in dir(genlm.core)
        if not name.startswith("_") and not isinstance(getattr(genlm.core, name), type(genlm.core))
    }
    assert set(genlm.core.__all__) == public == set(genlm.core._EXPORTS)
    assert genlm.core.__version__ != "0+unknown"


def test_embedded_model_resolves_offline():
    """`stories260K` resolves to the bundled files, identical to the shared originals' hashes."""
    path = Path(resolve_model_path("stories260K"))
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    assert digest == "407a7c581bdd66972383ce9ad24857713fb98786d06ea564a2fe9b34ebe77dfd"
    assert (path / "NOTICE.md").read_text().count("MIT") >= 1
    assert resolve_model_path("org/some-model") == "org/some-model"
