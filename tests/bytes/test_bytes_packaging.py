"""genlm-bytes stays cheap to discover: the CLI imports its plugin without numpy."""

import subprocess
import sys

import genlm.bytes


def test_plugin_import_is_light():
    """Importing genlm.bytes.plugin (what `genlm backends` does) loads no numpy or beam code."""
    code = (
        "import sys, genlm.bytes.plugin\n"
        "print(sorted(m for m in ('numpy', 'genlm.bytes._beam', 'genlm.core._trie') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_names_resolve():
    """Every name in genlm.bytes.__all__ resolves lazily to a real object."""
    for name in genlm.bytes.__all__:
        assert getattr(genlm.bytes, name) is not None
    assert set(genlm.bytes.__all__) == set(genlm.bytes._EXPORTS)
