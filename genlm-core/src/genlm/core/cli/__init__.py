"""The ``genlm`` command line: a module per command group, plugins add their own.

Core provides ``genlm backends`` and ``genlm smc``; installed plugins add commands
through the ``genlm_register_commands`` hook (genlm-bytes adds ``genlm bytes``).
Imports stay light so that ``genlm backends`` starts fast.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from genlm.core._command import Command


def _core_commands() -> list[Command]:
    from genlm.core.cli import _backends, _smc

    return [_backends.COMMAND, _smc.COMMAND]


def build_parser(commands: Sequence[Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="genlm",
        description="GenLM: fast, batched next-token probabilities on any engine.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands:
        command_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        command.configure(command_parser)
        command_parser.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``genlm`` script."""
    from genlm.core._registry import get_registry

    commands = _core_commands()
    names = {c.name for c in commands}
    commands += [c for n, c in sorted(get_registry().commands.items()) if n not in names]
    parser = build_parser(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * args.verbose, format="%(levelname)s %(name)s: %(message)s"
    )
    if args.command is None:
        parser.print_help()
        return 2
    return args._run(args)


if __name__ == "__main__":
    sys.exit(main())
