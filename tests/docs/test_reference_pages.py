"""The API reference pages list each module's public names: a ``members:`` list under a
``::: module`` directive names exactly what the module's ``__all__`` exports (a name
missing from the page is undocumented, one not in ``__all__`` is not public)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"

#: ``::: module`` then its options block, up to its ``members: [...]`` line.
DIRECTIVE = re.compile(r"^::: ([\w.]+)\n(?:[ \t]+.*\n)*?[ \t]+members: \[([^\]]*)\]", re.MULTILINE)


def member_lists() -> dict[str, list[str]]:
    """``module -> the names of its members: list``, from every reference page."""
    found = {}
    for page in sorted(REFERENCE.glob("*.md")):
        for module, names in DIRECTIVE.findall(page.read_text()):
            found[module] = [name.strip() for name in names.split(",") if name.strip()]
    return found


def test_every_members_list_is_its_modules_all():
    lists = member_lists()
    assert "genlm.core.cli" in lists  # the pattern still reads the pages
    for module, names in lists.items():
        exported = importlib.import_module(module).__all__
        assert sorted(names) == sorted(exported), module
