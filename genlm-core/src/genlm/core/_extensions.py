"""genlm-core's optional C extensions: loading them, and saying why one is not used.

Two modules are compiled at install time where a C compiler is found: ``_trie_kernel``
(the token-byte trie's kernel) and ``_ids`` (a context's checks and its ``Request``, on
every call's path). Without a compiler the install still succeeds and numpy or Python
does the same work, slower. So an absent extension is an expected case, but one that is
installed and fails to load (a damaged file, a wheel built for a newer glibc or another
machine) is a fault the user should hear of, with the loader's own error rather than a
guess about compilers.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

__all__ = ["IDS", "ids", "ids_error", "load_extension", "unavailable"]

logger = logging.getLogger(__name__)

IDS = "genlm.core._ids"


def load_extension(name: str) -> tuple[ModuleType | None, Exception | None]:
    """The extension module ``name``, or None and the error that stopped a present one.

    Only a module that is absent was not built (the error is then None); one that is there
    but fails to load keeps its own error.
    """
    try:
        return importlib.import_module(name), None
    except ModuleNotFoundError as exc:
        return None, None if exc.name == name else exc
    except (ImportError, OSError) as exc:
        return None, exc


def unavailable(name: str, what: str, error: Exception | None) -> str:
    """Why the extension ``name`` (``what`` it is, for the reader) is not used: not built,
    or present and failing with ``error``."""
    if error is None:
        return f"{what} was not built (no C compiler when genlm-core was installed)"
    return f"{what} ({name}) is installed but failed to load: {type(error).__name__}: {error}"


#: ``_ids`` where it loads, else None: the callers then check and hash in Python.
ids, ids_error = load_extension(IDS)
if ids_error is not None:  # said once, at import: every call then runs the slower checks
    logger.warning(
        "%s; contexts are checked in Python, slower. Reinstall genlm-core built here with "
        "a C compiler (pip install --force-reinstall --no-deps --no-binary genlm-core "
        "genlm-core)",
        unavailable(IDS, "context validation's C extension", ids_error),
    )
