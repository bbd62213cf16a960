"""The ``genlm`` command line: a module per command group, plugins add their own.

Core provides ``genlm backends`` and ``genlm smc``; installed plugins add commands
through the ``genlm_register_commands`` hook (genlm-bytes adds ``genlm bytes``).
Imports stay light so that ``genlm backends`` starts fast.

Errors a user can fix (a bad argument, an unknown backend, a missing model) end the
command with one line on stderr, ``genlm: error: ...``, and a non-zero exit status:
2 for arguments refused while parsing (argparse's convention), 1 for everything else
(a plugin command that checks an argument itself, as ``genlm bytes --beam 0``, exits 1).
``-v`` adds the traceback. A reader that leaves early (``genlm backends --json | head -1``)
ends the command quietly with status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import select
import sys
import traceback
from collections.abc import Callable, Sequence

from genlm.core._command import Command
from genlm.core._errors import describe
from genlm.core._plugin_hooks import command_hook
from genlm.core.cli._errors import CLIError, one_line
from genlm.core.cli._load import load_model, run_with
from genlm.core.cli._progress import add_progress_option, progress_bar
from genlm.core.cli._prompt import check_prompt, encode_text

__all__ = [
    "CLIError",
    "Command",
    "add_progress_option",
    "check_prompt",
    "command_hook",
    "encode_text",
    "load_model",
    "main",
    "one_line",
    "progress_bar",
    "run_with",
]


class _HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to each option whose default is a real value."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "%(default)" in text
            or not action.option_strings
            or action.default is None
            or action.default is False
            or action.default == argparse.SUPPRESS
        ):
            return text
        return text + " (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr (exit status 2).

    ``hidden_note``: what ``GENLM_BACKENDS`` hid (the registry's ``allowlist_note``), added
    to an unknown command's error, so a command of a hidden plugin does not read as one
    never installed.
    """

    hidden_note: str | None = None

    def error(self, message: str) -> None:  # type: ignore[override]
        if self.hidden_note and "invalid choice" in message:
            message = f"{message}; {self.hidden_note}"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _core_commands() -> list[Command]:
    from genlm.core.cli import _backends, _smc

    return [_backends.COMMAND, _smc.COMMAND]


def build_parser(
    commands: Sequence[Command],
    on_error: Callable[[Command, BaseException], None] | None = None,
) -> argparse.ArgumentParser:
    """The ``genlm`` parser with a subcommand per command.

    Every command is set up here, whichever one the user runs, so a broken plugin command
    must break only itself: one whose setup raises anything (``SystemExit`` included, a
    ``configure`` giving up with ``sys.exit``; only ``KeyboardInterrupt`` propagates) stays
    listed once its parser was made, but running it ends with one line naming the
    failure; the others work as usual. ``on_error`` is told first (``main`` reports it to
    the registry, so ``genlm backends`` lists the plugin); without it the error
    propagates. A command's ``help`` is plain text, so its ``%`` are escaped: argparse
    formats the listing with ``%``, and one plugin's ``50% faster`` would fail every
    ``genlm --help``.
    """
    parser = _Parser(
        prog="genlm",
        description="GenLM: fast, batched next-token probabilities on any engine.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands:
        command_parser = None
        try:
            command_parser = sub.add_parser(
                command.name,
                help=None if command.help is None else command.help.replace("%", "%%"),
                description=command.help,
                formatter_class=_HelpFormatter,
            )
            command.configure(command_parser)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a broken plugin command breaks only itself
            if on_error is None:
                raise
            on_error(command, exc)
            if command_parser is not None:
                command_parser.set_defaults(_run=functools.partial(_broken_command, exc))
            continue
        command_parser.set_defaults(_run=command.run)
    return parser


def _broken_command(exc: BaseException, args: argparse.Namespace) -> int:
    raise CLIError(f"this command's plugin failed to set it up: {describe(exc)}") from exc


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``genlm`` script (``argv``: None reads ``sys.argv``); returns the
    exit status (see the module): the command's own, 2 when no command was given (the help
    is printed), 130 on ``KeyboardInterrupt``; ``--help`` exits through ``SystemExit``."""
    from genlm.core._registry import get_registry

    try:  # plugins print to stderr: stdout is the command's (genlm backends --json)
        with contextlib.redirect_stdout(sys.stderr):
            registry = get_registry()
            commands = _core_commands() + [c for _, c in sorted(registry.commands.items())]
            parser = build_parser(
                commands, lambda command, exc: registry.command_failed(command.name, exc)
            )
    except KeyboardInterrupt:  # a slow plugin import, or a plugin command's setup
        print("genlm: interrupted", file=sys.stderr)
        return 130
    parser.hidden_note = registry.allowlist_note
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * args.verbose, format="%(levelname)s %(name)s: %(message)s"
    )
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args._run(args)
    except KeyboardInterrupt:
        print("genlm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError as exc:
        if not _reader_left():  # another pipe (a subprocess, an engine): a real error
            return _report(args, exc)
        # `genlm backends --json | head`: stop quietly, and write no more at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:
        return _report(args, exc)


def _report(args: argparse.Namespace, exc: Exception) -> int:
    """One line for the user (``-v`` shows where it came from); the exit status, 1."""
    if args.verbose:
        traceback.print_exception(exc)
    from genlm.core._errors import GenLMError

    ours = isinstance(exc, (CLIError, GenLMError))
    prefix = "" if ours else f"{type(exc).__name__}: "
    print(f"genlm {args.command}: error: {prefix}{one_line(exc)}", file=sys.stderr)
    return 1


def _reader_left() -> bool:
    """Whether stdout is a pipe whose reader has closed it (POLLERR on its write end)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object without a file
        return False
    if not hasattr(select, "poll"):  # Windows: assume the pipe that broke is stdout
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


if __name__ == "__main__":
    sys.exit(main())
