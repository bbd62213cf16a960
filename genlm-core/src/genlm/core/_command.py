"""``Command``: one ``genlm`` CLI subcommand, the type plugins register.

It lives on its own so that the plugin contract (:mod:`genlm.core.hookspecs`) and the
CLI (:mod:`genlm.core.cli`) both import it without importing each other.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import attrs

#: The subcommands genlm-core itself provides; a plugin registering one is reported.
CORE_COMMANDS = frozenset({"backends", "smc"})


@attrs.frozen
class Command:
    """One ``genlm`` subcommand.

    Attributes:
        name: the subcommand (``genlm NAME``).
        help: one line for ``genlm --help`` (None: listed without one).
        configure: adds the command's arguments to its ``argparse`` parser.
        run: runs the command with the parsed arguments; returns the exit status.
    """

    name: str
    help: str | None
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
