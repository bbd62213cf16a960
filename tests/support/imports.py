"""Which modules a statement imports, measured in a fresh interpreter.

Every distribution promises that discovery and its light modules import no heavy
library (torch, transformers, vllm, mlx, numpy where stated); each checks it this way.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path


def modules_loaded_by(statement: str, candidates: Iterable[str]) -> list[str]:
    """The ``candidates`` present in ``sys.modules`` after running ``statement`` alone."""
    names = sorted(candidates)
    code = (
        f"import json, sys\n{statement}\n"
        f"print(json.dumps([m for m in {names!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def type_checking_imports(path: Path) -> dict[str, str]:
    """``name -> module`` of the ``if TYPE_CHECKING:`` imports of a source file (the static
    mirror of a lazy package's ``_EXPORTS``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
    )
    return {
        alias.asname or alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
