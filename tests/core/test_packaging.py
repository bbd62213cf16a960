"""Packaging promises: namespace layout, light imports, public names, embedded model."""

import hashlib
import subprocess
import sys
from pathlib import Path

import genlm.core
from genlm.core import resolve_model_path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "vllm", "mlx", "mlx_lm", "scipy")


def test_no_genlm_init_anywhere():
    """`genlm` and `genlm.backends` stay PEP 420 namespaces: no __init__.py in them."""
    offenders = [
        p
        for pattern in ("*/src/genlm/__init__.py", "*/src/genlm/backends/__init__.py")
        for p in REPO.glob(pattern)
    ]
    assert offenders == []


def test_import_is_light():
    """`import genlm.core` imports no torch, transformers, vllm, mlx, or even scipy."""
    code = f"import sys, genlm.core; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_all_lists_exactly_the_public_names():
    """`genlm.core.__all__` matches the module's public attributes (submodules aside)."""
    public = {
        name
        for name, value in vars(genlm.core).items()
        if not name.startswith("_") and not isinstance(value, type(genlm.core))
    }
    assert set(genlm.core.__all__) == public


def test_embedded_model_resolves_offline():
    """`stories260K` resolves to the bundled files, identical to the shared originals' hashes."""
    path = Path(resolve_model_path("stories260K"))
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    assert digest == "407a7c581bdd66972383ce9ad24857713fb98786d06ea564a2fe9b34ebe77dfd"
    assert (path / "NOTICE.md").read_text().count("MIT") >= 1
    assert resolve_model_path("org/some-model") == "org/some-model"
