"""Every ``python`` code block of the documentation site (docs/**/*.md) runs.

A page's blocks run in order, as one script, in a fresh interpreter (as a reader pasting
them would), so a later block may use what an earlier one defined. A block preceded by
the line ``<!-- docs-test: skip -->`` is not run (for examples that need a GPU or a
download); say why beside it. A block preceded by ``<!-- file: PATH -->`` is a file of an
example distribution, not a script: tests/docs/test_backend_author_page.py builds and tests
those. Text included from elsewhere (README sections, the
distributions' READMEs) is tested where it lives.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
_BLOCK = re.compile(
    r"^(?P<skip>(?:<!-- docs-test: skip -->|<!-- file: [^\n]*-->)\n)?```python\n(?P<code>.*?)^```$",
    re.M | re.S,
)


def python_blocks(markdown: str) -> list[str]:
    """The code of each python block that is not marked to skip, in order."""
    return [m["code"] for m in _BLOCK.finditer(markdown) if not m["skip"]]


PAGES = sorted(p for p in DOCS.rglob("*.md") if python_blocks(p.read_text(encoding="utf-8")))


def test_the_block_finder_sees_blocks_and_skip_marks():
    """The parser finds python blocks and honours the skip mark (else this file tests nothing)."""
    text = (
        "x\n```python\na = 1\n```\n"
        "<!-- docs-test: skip -->\n```python\nb = 2\n```\n"
        "<!-- file: src/x.py -->\n```python\nc = 3\n```\n"
        "```bash\nc\n```\n"
    )
    assert python_blocks(text) == ["a = 1\n"]
    assert PAGES, "no python block found under docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_page_examples_run(page, tmp_path):
    """The page's python blocks run without error (their asserts are the checks)."""
    script = tmp_path / "example.py"
    script.write_text("\n".join(python_blocks(page.read_text(encoding="utf-8"))))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=240
    )
    assert out.returncode == 0, f"{page.name}:\n{out.stdout}\n{out.stderr}"
