"""Adds ``genlm bytes`` to the ``genlm`` CLI. Cheap to import: only genlm.core."""

from __future__ import annotations

from collections.abc import Callable

from genlm.core.cli import Command
from genlm.core.hookspecs import hookimpl


@hookimpl
def genlm_register_commands(register: Callable[[Command], None]) -> None:
    from genlm.bytes import _cli

    register(
        Command(
            name="bytes",
            help="show the next-byte distribution after a prompt, or sample byte by byte",
            configure=_cli.configure,
            run=_cli.run,
        )
    )
