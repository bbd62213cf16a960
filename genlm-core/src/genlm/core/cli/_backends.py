"""``genlm backends``: which backends are installed, and which can run here."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import sys

from genlm.core._command import Command


def _version(distribution: str | None) -> str:
    if distribution is None:
        return "?"
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def backend_rows() -> tuple[list[dict], list[dict]]:
    """One row per registered backend, and one per broken plugin.

    A broken plugin's ``incompatible`` is true when it was built for another plugin API
    (its ``error`` then names both versions and the ``pip install`` that fixes it).
    """
    from genlm.core._registry import get_registry

    registry = get_registry()
    rows = []
    for name, spec in sorted(registry.backends.items()):
        reason = spec.unavailable_reason()
        rows.append(
            {
                "name": name,
                "distribution": spec.distribution,
                "version": _version(spec.distribution),
                "available": reason is None,
                "status": "available" if reason is None else f"unavailable: {reason}",
                "auto_select": spec.auto_select,
                "priority": spec.priority,
                "description": spec.description,
            }
        )
    incompatible = {id(e) for e in registry.incompatible.values()}
    broken = [
        {
            "plugin": e.plugin,
            "distribution": e.distribution,
            "error": str(e),
            "incompatible": id(e) in incompatible,
        }
        for e in registry.errors
    ]
    return rows, broken


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def print_table(rows: list[dict]) -> None:
    """The rows as an aligned table, the status last (it can be long)."""
    header = ("backend", "distribution", "version", "auto", "status")
    table = [header] + [
        (
            r["name"],
            r["distribution"],
            r["version"],
            "yes" if r["auto_select"] else "no",
            r["status"],
        )
        for r in rows
    ]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header) - 1)]
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])


def run(args: argparse.Namespace) -> int:
    from genlm.core._registry import get_registry

    with contextlib.redirect_stdout(sys.stderr):  # a probe's prints must not reach the table
        rows, broken = backend_rows()
    registry = get_registry()
    if args.json:
        report = {"backends": rows, "broken": broken, "hidden": registry.hidden}
        print(json.dumps(report, indent=2))
        return 0
    if rows:
        print_table(rows)
    elif registry.allowlist_note is None:
        print("no backends installed; try: pip install genlm-backend-hf")
    for b in broken:
        if b["incompatible"]:  # the error is one line with the fix: print it alone
            print(f"\nincompatible {b['error']}")
            continue
        print(f"\nbroken plugin {b['plugin']} ({b['distribution'] or 'unknown distribution'}):")
        print(f"  {b['error']}")
    note = registry.allowlist_note
    if note is not None:
        print(f"\nnot loaded: {note}" if rows or broken else f"no backends loaded: {note}")
    return 0


COMMAND = Command(
    name="backends",
    help="list installed backends: distribution, version, available here or why not",
    configure=configure,
    run=run,
)
