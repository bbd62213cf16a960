"""What every smoke test shares: logging to the session's log, and checks of the install."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path


def start(name: str) -> None:
    """Log INFO to stderr (the nox log shows the trie kernel line) and say what runs."""
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    logging.getLogger("dist-smoke").info("%s smoke test on %s", name, sys.executable)


def assert_installed(module) -> None:
    """The module comes from the venv's site-packages, never from a source tree."""
    path = Path(module.__file__)
    assert "site-packages" in path.parts, f"{module.__name__} imported from {path}"


def run_genlm(*args: str) -> str:
    """Run the venv's ``genlm`` console script (installed by the wheel); its stdout."""
    script = Path(sys.executable).parent / "genlm"
    return subprocess.run(
        [str(script), *args], check=True, capture_output=True, text=True, timeout=600
    ).stdout
