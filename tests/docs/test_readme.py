"""Every code block of the READMEs runs, so none can rot.

Python blocks run as scripts and bash blocks with bash (``genlm`` is the venv's script),
each in its own process, from the repository root, against the embedded stories260K. A
block marked ``<!-- readme-test: output -->`` is the expected start of the previous
block's output and is compared with it. Blocks that install packages or need a GPU or a
cluster are marked ``<!-- readme-test: skip (why) -->``; ``<!-- readme-test: needs
MODULE -->`` runs a block only where MODULE imports (the mlx README, in the mlx session).
The markers are documented in ``tests/support/markdown.py``. The nox session ``bytes``
(genlm-core, -hf and -bytes) runs this file; ``mlx`` runs the mlx README's block.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.markdown import Block, code_blocks

ROOT = Path(__file__).parents[2]
READMES = [
    ROOT / "README.md",
    ROOT / "genlm-core" / "README.md",
    ROOT / "genlm-bytes" / "README.md",
    ROOT / "genlm-backend" / "README.md",
    *sorted(ROOT.glob("genlm-backend-*/README.md")),
]
RUNNABLE = {"python", "bash"}


def cases() -> list:
    """One pytest param per block: (block, the expected-output block after it or None)."""
    params = []
    for readme in READMES:
        blocks = code_blocks(readme)
        for i, block in enumerate(blocks):
            if block.marker == "readme-test" and block.value == "output":
                continue  # checked with the block before it
            after = blocks[i + 1] if i + 1 < len(blocks) else None
            expected = after if after and after.marker and after.value == "output" else None
            marks = []
            if block.marker == "readme-test" and block.value.startswith("skip"):
                marks.append(pytest.mark.skip(reason=block.value))
            elif block.marker == "readme-test" and block.value.startswith("needs "):
                module = block.value.split()[1]
                if importlib.util.find_spec(module) is None:
                    marks.append(pytest.mark.skip(reason=f"{module} is not installed"))
            ident = f"{readme.relative_to(ROOT)}:{block.line}"
            params.append(pytest.param(block, expected, id=ident, marks=marks))
    return params


@functools.cache
def run_block(block: Block) -> subprocess.CompletedProcess:
    """Run a python or bash block once per test session (the main command is checked twice)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    command = (
        [sys.executable, "-c", block.code]
        if block.lang == "python"
        else ["bash", "-e", "-o", "pipefail", "-c", block.code]
    )
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize(("block", "expected"), cases())
def test_readme_block_runs(block: Block, expected: Block | None):
    """The block runs without error (and prints what the README says it prints)."""
    assert block.lang in RUNNABLE, (
        f"a {block.lang or 'plain'} block that no test runs: make it python or bash, "
        "or mark it (see tests/support/markdown.py)"
    )
    out = run_block(block)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    # A python example that only defines a coroutine and never runs it prints nothing.
    assert block.lang != "python" or out.stdout.strip(), "the example printed nothing"
    if expected is not None:
        want = expected.code.splitlines()
        if "..." in want:
            want = want[: want.index("...")]
        assert out.stdout.splitlines()[: len(want)] == want


def test_the_main_command_honours_its_constraint():
    """The README's first command: no 'e' after the prompt, weights differ, ESS = 1/sum(w^2)."""
    [block] = [b for b in code_blocks(ROOT / "README.md") if b.code.startswith("genlm smc")]
    out = run_block(block)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    weights = [float(w) for w in lines[4].removeprefix("particle weights: ").split()]
    ess = float(lines[3].removeprefix("effective sample size: ").split()[0])
    assert len(set(weights)) > 1
    assert ess == pytest.approx(1 / sum(w * w for w in weights), rel=0.01)
    start = next(i for i, line in enumerate(lines) if line.startswith("posterior over "))
    texts = [line.split("  ", 1)[1] for line in lines[start + 1 :] if line]
    assert texts and all(t.startswith("Once upon a time") for t in texts)
    assert not any("e" in t[len("Once upon a time") :] for t in texts)


def test_every_readme_section_a_changelog_cites_is_a_section():
    """Each CHANGELOG's ``the repository README's "X" section`` names a level-2 heading of
    README.md (a reader following it finds the section; "Versions" was a bold paragraph)."""
    import re

    headings = {
        line[3:].strip()
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("## ")
    }
    cited = {}
    for changelog in sorted(ROOT.glob("*/CHANGELOG.md")):
        text = " ".join(changelog.read_text().split())  # citations may wrap
        for section in re.findall(r"README's \"([^\"]+)\" section", text):
            cited[section] = changelog.parent.name
    assert cited, "no CHANGELOG cites a README section: the pattern no longer matches"
    assert {s: d for s, d in cited.items() if s not in headings} == {}
