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

    name: str = attrs.field()
    help: str | None = attrs.field()
    configure: Callable[[argparse.ArgumentParser], None] = attrs.field()
    run: Callable[[argparse.Namespace], int] = attrs.field()

    # Checked when made, naming the field: one plugin's bad command (a name that is not a
    # string broke sorting the commands, so every ``genlm`` call) fails that plugin alone.

    @name.validator
    def _check_name(self, attribute: attrs.Attribute, value: object) -> None:
        """A subcommand's name: one word, usable on a command line."""
        if not isinstance(value, str):
            raise TypeError(f"Command name must be a string, got {value!r}")
        if not value or value.startswith("-") or len(value.split()) != 1:
            raise ValueError(
                f"Command name {value!r} must be one word with no whitespace, not starting with '-'"
            )

    @help.validator
    def _check_help(self, attribute: attrs.Attribute, value: object) -> None:
        """The line ``genlm --help`` shows, or None."""
        if value is not None and not isinstance(value, str):
            raise TypeError(f"Command help must be a string or None, got {value!r}")

    @configure.validator
    @run.validator
    def _check_callable(self, attribute: attrs.Attribute, value: object) -> None:
        """``configure`` and ``run``, which ``genlm`` calls."""
        if not callable(value):
            raise TypeError(f"Command {attribute.name} must be callable, got {value!r}")
