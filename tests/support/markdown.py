"""Code blocks of a Markdown file, with the marker comment that tells tests what to do.

A fenced block may be preceded (on its own line, blank lines allowed between) by one
HTML comment, invisible when rendered:

- ``<!-- readme-test: skip (why) -->``: never run (installs packages, needs a GPU or a
  cluster, a signature or a tree rather than code);
- ``<!-- readme-test: needs MODULE -->``: run only where ``MODULE`` imports (e.g. the mlx
  backend's README in the mlx session), skipped elsewhere;
- ``<!-- readme-test: output -->``: the expected start of the previous block's output
  (lines up to a ``...`` line are compared);
- ``<!-- file: PATH -->``: the block is the file PATH (docs/backend-author.md builds a
  distribution from these).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import attrs

_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*(readme-test|file):\s*(.*?)\s*-->\s*$")


@attrs.frozen
class Block:
    """One fenced code block."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None = None  # "readme-test" or "file"
    value: str = ""  # the marker's text: "skip (why)", "needs mlx", "output", a path

    @property
    def id(self) -> str:
        return f"{self.path.name}:{self.line}"


def code_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order, with its marker if it has one."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, lang = fence.groups()
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{path}:{i + 1}: unterminated code block")
        code = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        before = i - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = _MARKER.match(lines[before]) if before >= 0 else None
        kind, value = marker.groups() if marker else (None, "")
        blocks.append(Block(Path(path), i + 1, lang, code, kind, value))
        i = end + 1
    return blocks
