"""Backend discovery: entry points, pluggy, availability, auto-selection, loading.

Core never imports a backend by name. Each installed distribution that declares an
entry point in ``genlm.backends`` (or ``genlm.plugins``) is imported — one module, cheap
— and registered with a pluggy ``PluginManager``, which validates its hooks against
:mod:`genlm.core.hookspecs`. Each plugin's hook is then called on its own, so a plugin
that fails to import, validate or register is recorded as broken while the others keep
working. The environment variable ``GENLM_BACKENDS`` (comma-separated entry point
names) restricts which plugins load.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import re
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import pluggy

from genlm.core import hookspecs
from genlm.core._errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    PluginLoadError,
)

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUPS = ("genlm.backends", "genlm.plugins")
ALLOWLIST_ENV = "GENLM_BACKENDS"

_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
_TARGET = re.compile(r"^[\w.]+:[\w.]+$")


def _resolve(target: str) -> Any:
    """Import ``"package.module:attr.path"`` and return the attribute."""
    module_name, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
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
            backend can run here, or a short reason why not. Must be cheap: no heavy imports.
        priority: auto-selection rank; the available backend with the highest wins.
        auto_select: whether ``backend=None`` may pick it at all.
        description: one line for ``genlm backends``.
    """

    name: str = attrs.field()
    loader: str = attrs.field()
    distribution: str
    probe: str | Callable[[], str | None] | None = None
    priority: int = 0
    auto_select: bool = True
    description: str = ""

    @name.validator
    def _check_name(self, attribute, value):
        if not _NAME.match(value):
            raise ValueError(f"backend name {value!r} must match {_NAME.pattern}")

    @loader.validator
    def _check_loader(self, attribute, value):
        if not _TARGET.match(value):
            raise ValueError(f"loader {value!r} must look like 'package.module:callable'")

    def unavailable_reason(self) -> str | None:
        """None when this backend can run on this machine, else why it cannot."""
        if self.probe is None:
            return None
        try:
            probe = _resolve(self.probe) if isinstance(self.probe, str) else self.probe
            return probe()
        except Exception as exc:  # a broken probe must not break discovery
            return f"availability probe failed: {exc!r}"

    def load(self, model: str, **opts: Any) -> Any:
        """Import the loader and build a model."""
        return _resolve(self.loader)(model, **opts)


@attrs.define
class Registry:
    """The backends (and CLI commands) contributed by installed plugins.

    Build with :meth:`discover`; tests build one from explicit plugin modules.
    """

    backends: dict[str, BackendSpec] = attrs.field(factory=dict)
    commands: dict[str, Any] = attrs.field(factory=dict)
    errors: list[PluginLoadError] = attrs.field(factory=list)
    #: entry point name -> distribution name, for every plugin that loaded.
    plugins: dict[str, str | None] = attrs.field(factory=dict)

    @classmethod
    def discover(cls, allowlist: Iterable[str] | None = None) -> Registry:
        """Load every plugin declared by installed distributions."""
        if allowlist is None:
            env = os.environ.get(ALLOWLIST_ENV, "").strip()
            allowlist = [n.strip() for n in env.split(",") if n.strip()] if env else None
        allowed = None if allowlist is None else set(allowlist)
        registry = cls()
        modules: list[tuple[str, str | None, Any]] = []
        seen: set[tuple[str, str]] = set()
        for group in ENTRY_POINT_GROUPS:
            for ep in importlib.metadata.entry_points(group=group):
                if allowed is not None and ep.name not in allowed:
                    continue
                if (ep.name, ep.value) in seen:  # the same distribution seen twice on sys.path
                    continue
                seen.add((ep.name, ep.value))
                dist = ep.dist.name if ep.dist is not None else None
                try:
                    modules.append((ep.name, dist, ep.load()))
                except Exception as exc:
                    registry._broken(ep.name, dist, f"failed to import {ep.value}: {exc!r}", exc)
        registry.register_plugins(modules)
        return registry

    def register_plugins(self, modules: Iterable[tuple[str, str | None, Any]]) -> None:
        """Validate plugin modules with pluggy, then call each one's hooks in isolation."""
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        for name, dist, module in modules:
            try:
                pm.register(module, name=name)
            except Exception as exc:  # pluggy.PluginValidationError and friends
                self._broken(name, dist, f"invalid plugin: {exc}", exc)
                continue
            self.plugins[name] = dist
            for hook_name, register in (
                ("genlm_register_backends", self._register_backend),
                ("genlm_register_commands", self._register_command),
            ):
                for impl in getattr(pm.hook, hook_name).get_hookimpls():
                    if impl.plugin_name != name:
                        continue
                    try:
                        impl.function(register=_from(register, name, dist))
                    except Exception as exc:
                        self._broken(name, dist, f"{hook_name} raised {exc!r}", exc)

    def _register_backend(self, spec: BackendSpec, plugin: str, dist: str | None) -> None:
        if not isinstance(spec, BackendSpec):
            raise TypeError(f"register() takes a BackendSpec, got {type(spec).__name__}")
        other = self.backends.get(spec.name)
        if other is not None and other != spec:
            self._broken(
                plugin,
                dist,
                f"backend name {spec.name!r} is already provided by {other.distribution}",
            )
            return
        self.backends[spec.name] = spec

    def _register_command(self, command: Any, plugin: str, dist: str | None) -> None:
        if command.name in self.commands:
            self._broken(plugin, dist, f"command {command.name!r} is already registered")
            return
        self.commands[command.name] = command

    def _broken(
        self, plugin: str, dist: str | None, message: str, cause: Exception | None = None
    ) -> None:
        error = PluginLoadError(
            f"plugin {plugin!r} ({dist or 'unknown distribution'}): {message}",
            plugin=plugin,
            distribution=dist,
        )
        error.__cause__ = cause
        logger.info("%s", error)
        self.errors.append(error)

    # ---- choosing and loading ----------------------------------------------------------

    def select(self, backend: str | None = None) -> BackendSpec:
        """The spec for ``backend``, or the best available one when None."""
        if backend is not None:
            spec = self.backends.get(backend)
            if spec is None:
                raise BackendNotFoundError(self._not_found_message(backend))
            reason = spec.unavailable_reason()
            if reason is not None:
                raise BackendUnavailableError(f"backend {backend!r} cannot run here: {reason}")
            return spec
        candidates = sorted(
            (s for s in self.backends.values() if s.auto_select),
            key=lambda s: -s.priority,
        )
        reasons = []
        for spec in candidates:
            reason = spec.unavailable_reason()
            if reason is None:
                return spec
            reasons.append(f"{spec.name}: {reason}")
        raise BackendNotFoundError(
            "no usable backend is installed"
            + (f" ({'; '.join(reasons)})" if reasons else "")
            + self._installed_hint()
            + "; install one, e.g. pip install genlm-backend-hf"
        )

    def _not_found_message(self, backend: str) -> str:
        return (
            f"unknown backend {backend!r}"
            + self._installed_hint()
            + f"; to install it: pip install genlm-backend-{backend}"
        )

    def _installed_hint(self) -> str:
        names = ", ".join(sorted(self.backends)) or "none"
        hint = f"; installed backends: {names}"
        if self.errors:
            hint += "; broken plugins: " + ", ".join(e.plugin for e in self.errors)
        return hint


def _from(register: Callable, plugin: str, dist: str | None) -> Callable[[Any], None]:
    """A register callback that remembers which plugin is calling."""

    def register_from_plugin(item: Any) -> None:
        register(item, plugin, dist)

    return register_from_plugin


_registry: Registry | None = None


def get_registry(refresh: bool = False) -> Registry:
    """The process-wide registry, discovered on first use."""
    global _registry
    if _registry is None or refresh:
        _registry = Registry.discover()
    return _registry


def load_model_by_name(name: str, backend: str | None = None, **opts: Any) -> Any:
    """Load model ``name`` (a hub id, a local path, or ``"stories260K"``) with a backend.

    ``backend=None`` picks the best available installed backend: vllm with a CUDA GPU,
    mlx on Apple silicon, else hf. Options go to the backend's loader unchanged.

    Raises:
        BackendNotFoundError: the backend is not installed; the message lists the
            installed ones and the ``pip install`` to run.
        BackendUnavailableError: it is installed but cannot run on this machine.
    """
    spec = get_registry().select(backend)
    logger.info("loading %s with backend %s", name, spec.name)
    return spec.load(name, **opts)
