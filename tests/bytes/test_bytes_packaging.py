"""genlm-bytes stays cheap to discover: the CLI imports its plugin without numpy."""

from pathlib import Path

from support.imports import modules_loaded_by, type_checking_imports

import genlm.bytes


def test_plugin_import_is_light():
    """Importing genlm.bytes.plugin (what `genlm backends` does) loads no numpy or beam code."""
    heavy = ("numpy", "genlm.bytes._beam", "genlm.core._trie")
    assert modules_loaded_by("import genlm.bytes.plugin", heavy) == []


def test_public_names_resolve():
    """Every name in genlm.bytes.__all__ resolves lazily to a real object."""
    for name in genlm.bytes.__all__:
        assert getattr(genlm.bytes, name) is not None
    assert genlm.bytes.__all__ == list(genlm.bytes._EXPORTS)
    full = {n: (m if "." in m else f"genlm.bytes.{m}") for n, m in genlm.bytes._EXPORTS.items()}
    assert type_checking_imports(Path(genlm.bytes.__file__)) == full
