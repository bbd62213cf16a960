"""The version of the plugin API this genlm-core serves.

A backend plugin is built against the names it imports from genlm-core (``BatchedLM``
and its hooks, ``BackendSpec``, the hook specifications, ``Vocabulary``...) and states
which version of that API it was built for in its ``BackendSpec(plugin_api=...)``.
Registration rejects a spec whose version differs from :data:`PLUGIN_API`, so a plugin
built for another core is reported with a ``pip install`` that fixes it instead of
failing later, inside a model call. The README's versioning policy says when it changes.
"""

from __future__ import annotations

import importlib.metadata

from genlm.core._errors import describe

PLUGIN_API = 1
"""The plugin API version genlm-core serves: raised by each breaking change to it."""


def incompatibility(plugin_api: int, distribution: str) -> str | None:
    """Why a plugin built for ``plugin_api`` cannot be loaded here, or None when it can.

    Args:
        plugin_api: the version the plugin declares.
        distribution: the plugin's pip distribution, for the command that fixes it.

    Returns:
        None, or one line naming both versions and the ``pip install`` to run: the
        plugin's upgrade when it is older than core, core's when it is newer.
    """
    if plugin_api == PLUGIN_API:
        return None
    try:
        core = importlib.metadata.version("genlm-core")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        core = "(not installed)"
    upgrade = distribution if plugin_api < PLUGIN_API else "genlm-core"
    return (
        f"built for plugin API {plugin_api}, but genlm-core "
        f"{core} serves plugin API {PLUGIN_API}; not loaded; "
        f"to fix: pip install --upgrade {upgrade}"
    )


def mismatch_hint(exc: BaseException, distribution: str | None) -> str:
    """A note for a plugin's import or registration error that reads as a plugin API
    mismatch the version check could not see (it runs once a spec is built): a
    genlm.core name the plugin imports and this core lacks, or a ``BackendSpec`` or
    ``Command`` field it does not know. Empty for any other error.

    Returns:
        ``""``, or ``"; ..."`` naming this core's plugin API and the upgrades that fix it.
    """
    name = exc.name if isinstance(exc, ImportError) else None
    from_core = isinstance(name, str) and name.startswith("genlm.core")
    unknown_field = isinstance(exc, TypeError) and any(
        f"{cls}.__init__()" in describe(exc) for cls in ("BackendSpec", "Command")
    )
    if not (from_core or unknown_field):
        return ""
    fix = (
        f"pip install --upgrade genlm-core {distribution}"
        if distribution
        else "pip install --upgrade genlm-core, and upgrade the plugin"
    )
    return (
        f"; the plugin may be built for another genlm-core (this one serves plugin API "
        f"{PLUGIN_API}): {fix}"
    )
