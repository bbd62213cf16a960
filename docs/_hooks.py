"""MkDocs hooks: pages that reuse the repository's own text instead of copying it.

Directives are HTML comments in ``docs/*.md`` (invisible if a page is read raw):

* ``<!-- readme: HEADING -->`` is replaced by the README's level-2 section whose heading
  starts with HEADING (the heading line itself dropped). A missing section fails the build.
* ``<!-- architecture: HEADING -->``: the same for a level-2 section of ARCHITECTURE.md
  (the site shows users its Guarantees; the README links there, rewritten to this page).
* ``<!-- benchmark-results -->`` includes every ``benchmarks/results/*.md``, in the order
  ``benchmarks/collect_results.py`` uses, through pymdownx.snippets.
* ``<!-- cli-help: ARGS -->`` is the output of ``genlm ARGS --help``, run at build time so
  the page always matches the installed CLI (a failing command fails the build).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_ORDER = ["core", "trie", "hf", "bytes", "mlx", "vllm", "gpu"]

_DIRECTIVE = re.compile(r"<!--\s*([a-z-]+):?\s*(.*?)\s*-->")


#: Links from included README text to repository files that are not site pages, and where
#: the site shows the same text.
_LINK_REWRITES = {
    "](ARCHITECTURE.md#guarantees)": "](concepts.md#guarantees)",
    "](genlm-bytes/README.md#": "](distributions/bytes.md#",
}


def readme_section(heading: str, file: str = "README.md") -> str | None:
    """The body of ``file``'s ``## HEADING...`` section, or None if there is none."""
    lines = (ROOT / file).read_text(encoding="utf-8").splitlines()
    start = next(
        (i for i, line in enumerate(lines) if line.startswith(f"## {heading}")),
        None,
    )
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    body = "\n".join(lines[start + 1 : end]).strip() + "\n"
    for old, new in _LINK_REWRITES.items():
        body = body.replace(old, new)
    return body


def benchmark_includes() -> str:
    """Snippet lines including each benchmark result file, known areas first."""
    names = sorted(p.stem for p in (ROOT / "benchmarks" / "results").glob("*.md"))
    ordered = [n for n in RESULTS_ORDER if n in names] + [
        n for n in names if n not in RESULTS_ORDER
    ]
    return "\n\n".join(f'--8<-- "benchmarks/results/{n}.md"' for n in ordered) + "\n"


def cli_help(args: list[str]) -> str:
    """The text of ``genlm ARGS --help``, as the installed CLI prints it."""
    env = {**os.environ, "COLUMNS": "90"}
    out = subprocess.run(
        [sys.executable, "-m", "genlm.core.cli", *args, "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if out.returncode != 0:
        raise RuntimeError(f"genlm {' '.join(args)} --help failed: {out.stderr.strip()}")
    return out.stdout


def expand(kind: str, argument: str, page: str) -> str:
    """The Markdown one directive stands for."""
    if kind == "readme":
        body = readme_section(argument)
        if body is None:
            raise ValueError(f"{page}: README.md has no '## {argument}' section")
        return body
    if kind == "architecture":
        body = readme_section(argument, "ARCHITECTURE.md")
        if body is None:
            raise ValueError(f"{page}: ARCHITECTURE.md has no '## {argument}' section")
        return body
    if kind == "benchmark-results":
        return benchmark_includes()
    if kind == "cli-help":
        return "```text\n" + cli_help(argument.split()) + "```\n"
    raise ValueError(f"{page}: unknown directive {kind!r}")


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs hook
    """Expand the directives of one page (MkDocs calls this before rendering it)."""
    known = {
        "readme",
        "architecture",
        "benchmark-results",
        "cli-help",
    }

    def replace(match: re.Match) -> str:
        kind, argument = match.group(1), match.group(2)
        if kind not in known:
            return match.group(0)  # an ordinary comment
        return expand(kind, argument, page.file.src_path)

    return _DIRECTIVE.sub(replace, markdown)
