"""Run a script against a copy of genlm.core whose C extension is absent or damaged.

A damaged extension stands for one that is installed but cannot load (in the field, a
wheel built for a newer glibc): here a file of its name that is not a shared library.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import genlm.core

PREAMBLE = """
import importlib, logging
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
try:
    importlib.import_module("genlm.core.{name}")
except ImportError as exc:
    print("CAUSE", exc)
"""


def run_without_extension(
    tmp_path: Path, name: str, state: str, script: str
) -> tuple[dict[str, str], str]:
    """Run ``script`` where genlm.core's extension ``name`` (``"_ids"``) is ``state``
    (``"absent"`` or ``"damaged"``); its stdout's ``KEY rest`` lines as a dict (``CAUSE``:
    the error importing the extension) and its stderr (the log, INFO and up)."""
    package = tmp_path / "genlm" / "core"
    shutil.copytree(Path(genlm.core.__file__).parent, package)
    for built in package.glob(f"{name}*.so"):
        built.unlink()
    if state == "damaged":
        (package / f"{name}.abi3.so").write_text("not a shared library")
    run = subprocess.run(
        [sys.executable, "-c", PREAMBLE.format(name=name) + script],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    return dict(line.split(" ", 1) for line in run.stdout.splitlines()), run.stderr
