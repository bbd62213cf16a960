"""docs/backend-author.md builds a working backend: its files are extracted and run.

The page's ``<!-- file: PATH -->`` blocks are written into a fresh folder. Instead of a
slow ``pip install``, the distribution's metadata is written the way pip would: a
``.dist-info`` folder (METADATA and the entry points of the page's pyproject.toml) on a
path put on ``PYTHONPATH`` with the page's ``src``. ``importlib.metadata`` then finds the
entry point exactly as for an installed package, so discovery, the ``genlm`` CLI and the
page's own tests (the conformance kit, run with pytest's deprecation warnings as errors)
see a real installed backend.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support.markdown import code_blocks

PAGE = Path(__file__).parents[2] / "docs" / "backend-author.md"


def test_every_block_is_a_file_or_marked_skip():
    """No block of the page can rot unnoticed: each is extracted and run, or marked skip."""
    for block in code_blocks(PAGE):
        runs = block.marker == "file"
        skipped = block.marker == "readme-test" and block.value.startswith("skip")
        assert runs or skipped, f"{block.id}: a block that is neither a file nor marked skip"


def write_distribution(root: Path) -> tuple[Path, Path]:
    """The page's files under ``root/project`` and pip-style metadata under ``root/site``."""
    project = root / "project"
    for block in code_blocks(PAGE):
        if block.marker == "file":
            target = project / block.value
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code, encoding="utf-8")
    meta = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    name, version = meta["name"], meta["version"]
    dist_info = root / "site" / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
    )
    groups = meta["entry-points"]
    (dist_info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
            for group, eps in groups.items()
        ),
        encoding="utf-8",
    )
    return project, root / "site"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(project folder, environment) with the page's backend importable and discoverable."""
    project, site = write_distribution(tmp_path_factory.mktemp("backend-author"))
    env = {k: v for k, v in os.environ.items() if k not in ("GENLM_BACKENDS", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(project / "src")])
    return project, env


def test_page_tests_pass_with_deprecations_as_errors(built):
    """The page's conformance tests and discovery test all pass, with no deprecation warning."""
    project, env = built
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "error::pytest.PytestDeprecationWarning",
            "tests",
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    summary = out.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "warning" not in summary
    assert int(summary.split()[0]) > 20  # the whole kit ran, not just the discovery test


def test_cli_lists_the_page_backend_as_installed_and_manual(built):
    """`genlm backends` sees the page's backend: available, never auto-selected."""
    project, env = built
    out = subprocess.run(
        [sys.executable, "-m", "genlm.core.cli", "backends", "--json"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    [foo] = [b for b in json.loads(out.stdout)["backends"] if b["name"] == "foo"]
    assert foo["distribution"] == "genlm-backend-foo" and foo["version"] == "0.1.0"
    assert foo["available"] is True and foo["auto_select"] is False
