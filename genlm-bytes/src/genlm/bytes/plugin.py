"""Adds ``genlm bytes`` to the ``genlm`` CLI.

Cheap to import, and so is registering: the command's arguments are declared here, and
the package (numpy, the beam, the trie) is imported only when the command runs.
"""

from __future__ import annotations

import argparse

from genlm.core import DEFAULT_MODEL
from genlm.core.cli import Command, add_progress_option, command_hook


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="text to continue")
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"model name or path (default: {DEFAULT_MODEL})"
    )
    parser.add_argument("--backend", default=None, help="backend name (default: best available)")
    parser.add_argument("-K", "--beam", type=int, default=8, help="beam width")
    parser.add_argument("--top", type=int, default=10, help="how many next bytes to show")
    parser.add_argument(
        "--sample", type=int, default=0, metavar="N", help="then sample N bytes, one at a time"
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    parser.add_argument("--seed", type=int, default=None, help="random seed")
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    from genlm.bytes import _cli

    return _cli.run(args)


genlm_register_commands = command_hook(
    Command(
        name="bytes",
        help="show the next-byte distribution after a prompt, or sample byte by byte",
        configure=configure,
        run=run,
    )
)
