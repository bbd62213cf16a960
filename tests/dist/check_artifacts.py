"""Every built distribution carries its licence text, every sdist its change log, and every
wheel its ``py.typed``.

Usage: ``python check_artifacts.py DIST_DIR``: each ``*.tar.gz`` must hold ``LICENSE`` and
``CHANGELOG.md``; each
``*.whl`` must hold ``*.dist-info/licenses/LICENSE`` and a ``py.typed`` beside its package
(their metadata declare ``License-Expression: MIT`` and typed packages).
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path


def problems(folder: Path) -> list[str]:
    found = []
    for sdist in sorted(folder.glob("*.tar.gz")):
        with tarfile.open(sdist) as archive:
            members = {name.partition("/")[2] for name in archive.getnames()}
        for name in ("LICENSE", "CHANGELOG.md"):
            if name not in members:
                found.append(f"{sdist.name}: no {name}")
    wheels = sorted(folder.glob("*.whl"))
    for wheel in wheels:
        names = zipfile.ZipFile(wheel).namelist()
        if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
            found.append(f"{wheel.name}: no .dist-info/licenses/LICENSE")
        if not any(n.endswith("/py.typed") for n in names):
            found.append(f"{wheel.name}: no py.typed")
    if not wheels:
        found.append(f"{folder}: no wheels")
    return found


def main(folder: str) -> None:
    found = problems(Path(folder))
    if found:
        sys.exit("\n".join(found))
    print(f"{folder}: every artifact carries LICENSE, every sdist CHANGELOG.md, every wheel py.typed")


if __name__ == "__main__":
    main(sys.argv[1])
