"""Fails on import, like a plugin whose heavy dependency is missing."""

import genlm_dependency_that_is_not_installed  # noqa: F401
