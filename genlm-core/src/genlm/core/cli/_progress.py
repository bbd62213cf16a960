"""The progress bar of a long command (``genlm smc``, ``genlm bytes --sample``) and the
``--no-progress`` option that hides it, written once so every command behaves alike."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tqdm import tqdm


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--no-progress``, which :func:`progress_bar` reads: the bar is drawn on stderr,
    which a log or a script reading it may not want."""
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def progress_bar(args: argparse.Namespace, total: int, *, desc: str, unit: str) -> tqdm:
    """A tqdm bar on stderr for ``total`` steps of ``unit``, hidden by ``--no-progress``
    (see :func:`add_progress_option`); use it as a context manager, so it closes before
    the command prints its result. tqdm is imported here, when the command runs, so
    setting up the ``genlm`` parser stays light."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=args.no_progress)
