"""``BackendSpec``: what a plugin tells core about one backend.

Its own module so that the plugin contract (:mod:`genlm.core.hookspecs`) and the
registry that reads it (:mod:`genlm.core._registry`) import it without a loop.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable
from typing import Any

import attrs

from genlm.core._errors import describe

_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
_TARGET = re.compile(r"^[\w.]+:[\w.]+$")


def _check_target(field: str, value: str) -> None:
    """Raise ``ValueError`` unless ``value`` looks like ``"package.module:callable"``."""
    if not _TARGET.match(value):
        raise ValueError(f"{field} {value!r} must look like 'package.module:callable'")


def _resolve(target: str) -> Any:
    """Import ``"package.module:attr.path"`` and return the attribute.

    Raises:
        ImportError: the module (or one it imports) is missing, or has no such attribute:
            then, as importlib's "cannot import name", naming both parts of ``target``.
    """
    module_name, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ImportError(
                f"cannot import name {qualname!r} from {module_name!r} ({exc})",
                name=module_name,
            ) from exc
    return obj


@attrs.frozen
class BackendSpec:
    """What a plugin tells core about one backend.

    Attributes:
        name: the name users pass as ``backend=`` (lowercase).
        loader: ``"module:callable"`` building a model, called as ``loader(model, **opts)``;
            imported only when the backend is loaded.
        distribution: the pip distribution providing it (for ``pip install`` hints).
        probe: a callable (or its ``"module:callable"`` path) returning None when the
            backend can run here, or a short reason why not (a non-empty string; anything
            else is a broken probe, see :meth:`unavailable_reason`). Must be cheap: no
            heavy imports.
        priority: auto-selection rank; the available backend with the highest wins.
        auto_select: whether ``backend=None`` may pick it at all (default False: a backend
            serves users who name none only when its plugin says so).
        description: one line for ``genlm backends``.
        plugin_api: the plugin API version the plugin was built for (keyword only,
            required): a literal, never ``genlm.core.backend.PLUGIN_API`` read at run time.
            Registration rejects a spec built for another version than the installed
            genlm-core serves.
    """

    name: str = attrs.field()
    loader: str = attrs.field()
    distribution: str = attrs.field(validator=attrs.validators.instance_of(str))
    probe: str | Callable[[], str | None] | None = attrs.field(default=None)
    priority: int = attrs.field(default=0)
    auto_select: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    description: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    plugin_api: int = attrs.field(kw_only=True)

    @probe.validator
    def _check_probe(self, attribute, value):
        if isinstance(value, str):
            _check_target("probe", value)
        elif value is not None and not callable(value):
            raise TypeError(f"probe must be callable, a 'module:callable' path or None: {value!r}")
        try:  # specs are compared and hashed when plugins claim names
            hash(value)
        except TypeError:
            raise TypeError(
                f"probe {value!r} must be hashable (a function or a 'module:callable' path)"
            ) from None

    @priority.validator
    def _check_priority(self, attribute, value):
        if type(value) is not int:
            raise TypeError(f"priority must be an int, got {value!r}")

    @name.validator
    def _check_name(self, attribute, value):
        if not _NAME.match(value):
            raise ValueError(f"backend name {value!r} must match {_NAME.pattern}")

    @loader.validator
    def _check_loader(self, attribute, value):
        _check_target("loader", value)

    @plugin_api.validator
    def _check_plugin_api(self, attribute, value):
        if type(value) is not int or value < 1:
            raise ValueError(f"plugin_api {value!r} must be a positive int")

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run on this machine, or None when it can.

        Checks what is cheap to check without importing the backend: that the loader's
        module exists (``importlib.util.find_spec``, which imports its parent packages
        only), then the plugin's own probe. A probe that raises (``SystemExit``
        included), or returns anything but None or a non-empty string (``True``,
        ``False``, ``""``), is broken: the backend is unavailable, the reason saying so,
        rather than the caller breaking.

        Returns:
            None, or a short reason such as ``"missing torch: pip install ..."``.

        Raises:
            KeyboardInterrupt: only that propagates.
        """
        module_name = self.loader.partition(":")[0]
        try:
            found = importlib.util.find_spec(module_name) is not None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a parent package that fails to import
            return f"loader module {module_name!r} cannot be found: {describe(exc)}"
        if not found:
            return (
                f"loader module {module_name!r} is not installed "
                f"(is {self.distribution} installed completely?)"
            )
        if self.probe is None:
            return None
        try:
            probe = _resolve(self.probe) if isinstance(self.probe, str) else self.probe
            reason = probe()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a broken probe must not break discovery
            return f"availability probe failed: {describe(exc)}"
        if reason is None or (isinstance(reason, str) and reason.strip()):
            return reason
        return (  # True or "" read as a reason would say "unavailable: True"
            f"availability probe failed: it returned {reason!r}, where a probe returns None "
            "(the backend can run here) or a non-empty string saying why not"
        )

    def import_loader(self) -> Callable[..., Any]:
        """Import the loader's module (the backend's heavy imports happen here).

        Returns:
            The loader callable named by :attr:`loader`.

        Raises:
            ImportError: the module (or one it imports) is missing, or it has no such
                callable (the message names :attr:`loader`).
        """
        return _resolve(self.loader)

    def load(self, model: str, **opts: Any) -> Any:
        """Import the loader and build a model.

        Args:
            model: a hub id, a local path or an embedded model's name.
            **opts: passed to the loader unchanged.

        Returns:
            The backend's model (an :class:`~genlm.core.AsyncLM`).

        Raises:
            ImportError: the loader cannot be imported.
            Exception: whatever the loader raises for this model.
        """
        return self.import_loader()(model, **opts)
