"""Backend discovery: entry points, pluggy, availability, auto-selection, loading.

Core never imports a backend by name. Each installed distribution that declares an
entry point in ``genlm.backends`` (or ``genlm.plugins``) is imported — one module, cheap
— and registered with a pluggy ``PluginManager``, which validates its hooks against
:mod:`genlm.core.hookspecs`. Each plugin's hook is then called on its own, so a plugin
that fails to import, validate or register is recorded as broken while the others keep
working. A backend declared for another plugin API version than this genlm-core serves
(``BackendSpec.plugin_api``) is not registered: it is reported, with the ``pip install``
that fixes it, in ``registry.errors`` and ``genlm backends``, and by
``load_model_by_name`` when asked for. The environment variable ``GENLM_BACKENDS``
(comma-separated entry point names) restricts which plugins load; names are
case-insensitive (``HF`` is ``hf``). When it hides installed plugins, every "no such
backend" message names the variable, its value and the plugins it hid, so a filter is
never mistaken for a missing install.

Everything a plugin runs (its import, its hooks, its probe) is isolated: any exception,
``SystemExit`` included, makes it a :class:`PluginLoadError` (or an "unavailable" reason)
instead of stopping discovery. Only ``KeyboardInterrupt`` propagates: the user asked to stop.

Who gets a backend name does not depend on discovery order: the distribution a name
belongs to (``genlm-backend-NAME`` owns ``NAME``; genlm-core owns ``mock``) wins, and any
other claim on it is reported as an error on the intruder. A name claimed by several
distributions none of which owns it goes to none of them: each claim is reported. So does a
name one plugin registers more than once with different specs: the plugin is told to
register each name once.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
import os
import re
import reprlib
import warnings
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from typing import Any

import attrs
import pluggy

from genlm.core import hookspecs
from genlm.core._backend_spec import BackendSpec
from genlm.core._command import CORE_COMMANDS, Command
from genlm.core._errors import (
    BackendError,
    BackendNotFoundError,
    BackendUnavailableError,
    PluginLoadError,
    describe,
)
from genlm.core._plugin_api import incompatibility, mismatch_hint

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUPS = ("genlm.backends", "genlm.plugins")
ALLOWLIST_ENV = "GENLM_BACKENDS"

#: Backend names owned by a distribution other than ``genlm-backend-NAME``.
_OWNERS = {"mock": "genlm-core"}


def owner_of(name: str) -> str:
    """The distribution a backend name belongs to: ``genlm-backend-NAME``, or genlm-core for mock.

    Args:
        name: a backend name (``"hf"``).

    Returns:
        The owning distribution's normalized name (``"genlm-backend-hf"``).
    """
    return _OWNERS.get(name, _normalize(f"genlm-backend-{name}"))


def _normalize(distribution: str) -> str:
    """A distribution name in PEP 503 form (``Genlm_Backend.HF`` -> ``genlm-backend-hf``)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


@attrs.frozen
class _Claim:
    """One plugin's registration of one backend name, with the distribution it came from."""

    spec: BackendSpec
    plugin: str
    distribution: str | None
    #: The owner's claim from a build for another plugin API (already reported): it
    #: still holds the name against others, but no backend is served under it.
    incompatible: PluginLoadError | None = attrs.field(default=None, eq=False)

    @property
    def source(self) -> tuple[str, str | None]:
        """The plugin that made the claim: its entry point name and distribution."""
        return self.plugin, self.distribution and _normalize(self.distribution)

    @property
    def owns(self) -> bool:
        """Whether the claiming distribution is the one the name belongs to."""
        return self.distribution is not None and _normalize(self.distribution) == owner_of(
            self.spec.name
        )


def _intrudes(name: str, claim: _Claim) -> str:
    """The reason reported on a claim on ``name`` by a plugin that does not own it."""
    return (
        f"backend name {name!r} belongs to {owner_of(name)}; this claim on it is ignored "
        f"(rename the backend, or uninstall {claim.distribution or 'this plugin'})"
    )


def _arbitrate(
    name: str, claims: list[_Claim], failed: Collection[str] = ()
) -> tuple[_Claim | None, list[tuple[_Claim, str]]]:
    """Decide who gets ``name``; the result depends only on the set of claims, not their order.

    Returns:
        The winning claim (None when the name is ambiguous) and each rejected claim with
        the reason reported on it.
    """
    distinct: dict[tuple[BackendSpec, str | None], _Claim] = {}
    for claim in claims:  # the same spec from the same distribution counts once
        key = (claim.spec, claim.distribution and _normalize(claim.distribution))
        distinct.setdefault(key, claim)
    unique = list(distinct.values())
    owner = owner_of(name)
    owners = [c for c in unique if c.owns]
    if not owners and owner in failed:  # installed, but its plugin failed: the name stays its own
        return None, [
            (c, f"{_intrudes(name, c)}; {owner} is installed but its plugin failed to load")
            for c in unique
        ]
    if len(owners) == 1:
        winner = owners[0]
        return winner, [(c, _intrudes(name, c)) for c in unique if c is not winner]
    if len(unique) == 1:
        return unique[0], []
    claimants = ", ".join(sorted({c.distribution or "unknown distribution" for c in unique}))
    per_plugin = Counter(c.source for c in unique)

    def reason(claim: _Claim) -> str:
        times = per_plugin[claim.source]
        if times > 1:  # uninstalling would not help: the plugin itself is wrong
            return (
                f"it registered backend name {name!r} {times} times, with different "
                "specs, so none is used; a plugin must register each name once"
            )
        if owners and not claim.owns:  # the owner's own claims are void, but the name is its
            return _intrudes(name, claim)
        return (
            f"backend name {name!r} is claimed {len(unique)} times ({claimants}) and its "
            f"owner {owner} does not hold it alone, so none is used; uninstall all but one"
        )

    return None, [(c, reason(c)) for c in unique]


@attrs.define
class Registry:
    """The backends (and CLI commands) contributed by installed plugins.

    Build with :meth:`discover`; tests build one with :meth:`register_plugins` from plugin
    modules made in memory. Precedence between plugins never depends on the order in
    which they are found (see the module docstring).

    Attributes:
        backends: backend name -> the spec that won it.
        commands: CLI command name -> its ``genlm.core.cli.Command``.
        errors: one :class:`PluginLoadError` per broken plugin or rejected claim.
        plugins: ``(entry point name, distribution)`` of every plugin that loaded.
        hidden: entry point names of the installed plugins the allowlist kept from loading.
        allowlist_note: what the allowlist hid, as a sentence for messages (its value,
            the plugins it hid, what to do); None when it hid nothing.
        incompatible: backend name -> the error of a spec built for another plugin API.
    """

    backends: dict[str, BackendSpec] = attrs.field(factory=dict)
    commands: dict[str, Any] = attrs.field(factory=dict)
    errors: list[PluginLoadError] = attrs.field(factory=list)
    plugins: list[tuple[str, str | None]] = attrs.field(factory=list)
    hidden: list[str] = attrs.field(factory=list)
    allowlist_note: str | None = None
    incompatible: dict[str, PluginLoadError] = attrs.field(factory=dict)
    _claims: dict[str, list[_Claim]] = attrs.field(factory=dict, init=False, repr=False)
    _winners: dict[str, _Claim] = attrs.field(factory=dict, init=False, repr=False)
    _rejected: set[_Claim] = attrs.field(factory=set, init=False, repr=False)
    #: normalized distributions whose plugin failed to import, validate or register.
    _failed: set[str] = attrs.field(factory=set, init=False, repr=False)
    #: backend name -> why no claim on it is served (ambiguous, registered twice...).
    _lost: dict[str, str] = attrs.field(factory=dict, init=False, repr=False)
    #: command name -> (entry point name, distribution) of the plugin that registered it.
    _command_plugins: dict[str, tuple[str, str | None]] = attrs.field(
        factory=dict, init=False, repr=False
    )

    @classmethod
    def discover(cls, allowlist: Iterable[str] | None = None) -> Registry:
        """Load every plugin declared by installed distributions.

        Entry points are taken in a sorted order, so discovery is reproducible. A plugin
        whose import raises anything (``SystemExit`` included) is recorded in
        :attr:`errors`; only ``KeyboardInterrupt`` propagates.

        Args:
            allowlist: entry point names to load, case-insensitive; None reads
                ``GENLM_BACKENDS`` (comma-separated), and loads every plugin when it is
                unset or blank.

        Returns:
            A new registry.
        """
        if allowlist is None:
            env = os.environ.get(ALLOWLIST_ENV, "")
            allowlist = [n.strip() for n in env.split(",") if n.strip()] if env.strip() else None
            given = f"{ALLOWLIST_ENV}={env!r}"
            advice = f"; unset {ALLOWLIST_ENV} or list the plugins to load in it"
        else:
            allowlist = list(allowlist)
            given, advice = f"allowlist={allowlist!r}", ""
        allowed = None if allowlist is None else {n.casefold() for n in allowlist}
        found, hidden = [], set()
        for group in ENTRY_POINT_GROUPS:
            for ep in importlib.metadata.entry_points(group=group):
                if allowed is not None and ep.name.casefold() not in allowed:
                    hidden.add(ep.name)
                    continue
                dist = ep.dist.name if ep.dist is not None else None
                found.append((ep.name, ep.value, _normalize(dist or ""), dist, ep))
        registry = cls(hidden=sorted(hidden))
        if hidden:
            unmatched = sorted(allowed - {name.casefold() for name, *_ in found})
            registry.allowlist_note = (
                f"{given} hides the installed plugins {', '.join(registry.hidden)}"
                + (f" and names no installed plugin {', '.join(unmatched)}" if unmatched else "")
                + advice
            )
        modules: list[tuple[str, str | None, Any]] = []
        seen: set[tuple[str, str]] = set()
        for name, value, _, dist, ep in sorted(found, key=lambda f: f[:3]):
            if (name, value) in seen:  # the same distribution seen twice on sys.path
                continue
            seen.add((name, value))
            try:
                modules.append((name, dist, ep.load()))
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # SystemExit too: a plugin never stops discovery
                message = f"failed to import {value}: {describe(exc)}{mismatch_hint(exc, dist)}"
                registry._plugin_failed(name, dist, message, exc)
        registry.register_plugins(modules)
        return registry

    def register_plugins(self, modules: Iterable[tuple[str, str | None, Any]]) -> None:
        """Validate plugin modules with pluggy, then call each one's hooks in isolation.

        Args:
            modules: ``(entry point name, distribution or None, module)`` triples. The
                distribution decides who owns a backend name; None owns nothing.
        """
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        registered: set[int] = set()
        for index, (name, dist, module) in enumerate(modules):
            key = f"{index}:{name}"  # two distributions may use one entry point name
            if id(module) in registered:  # one module under both entry point groups: its
                self.plugins.append((name, dist))  # hooks ran once, for all it declares
                continue
            registered.add(id(module))
            try:
                pm.register(module, name=key)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # pluggy.PluginValidationError and friends
                self._plugin_failed(name, dist, f"invalid plugin: {exc}", exc)
                continue
            self.plugins.append((name, dist))
            given: list[Any] = []  # what the plugin's hooks passed to register
            implemented, failed = [], False
            hooks = (
                ("genlm_register_backends", self._claim_backend),
                ("genlm_register_commands", self._register_command),
            )
            for hook_name, register in hooks:
                for impl in getattr(pm.hook, hook_name).get_hookimpls():
                    if impl.plugin_name != key:
                        continue
                    implemented.append(hook_name)
                    try:
                        impl.function(register=_from(register, name, dist, given))
                    except KeyboardInterrupt:
                        raise
                    except BaseException as exc:
                        failed = True
                        message = f"{hook_name} raised {describe(exc)}{mismatch_hint(exc, dist)}"
                        self._plugin_failed(name, dist, message, exc)
            if not given and not failed:
                hook_names = [hook_name for hook_name, _ in hooks]
                nothing = _registered_nothing(module, hook_names, implemented)
                self._plugin_failed(name, dist, nothing)
        self._settle()

    def _claim_backend(self, spec: BackendSpec, plugin: str, dist: str | None) -> None:
        if not isinstance(spec, BackendSpec):
            raise TypeError(f"register() takes a BackendSpec, got {type(spec).__name__}")
        claim = _Claim(spec, plugin, dist)
        reason = incompatibility(spec.plugin_api, dist or spec.distribution)
        if reason is not None:
            error = self._broken(plugin, dist, f"backend {spec.name!r} {reason}")
            if not claim.owns:  # out of the running
                self.incompatible[spec.name] = error
                return
            # The owner's name stays its own: another plugin must not take it over.
            claim = _Claim(spec, plugin, dist, error)
        claims = self._claims.setdefault(spec.name, [])
        if claim not in claims:
            claims.append(claim)

    def _settle(self) -> None:
        """Give each claimed name to its winner; report every rejected claim once."""
        reported: set[tuple[str, str | None, str]] = set()  # a plugin's claims, one line
        for name in sorted(self._claims):
            winner, rejected = _arbitrate(name, self._claims[name], self._failed)
            if winner is None and rejected:
                self._lost[name] = rejected[0][1]
            if winner is None or winner.incompatible is not None:
                self.backends.pop(name, None)
                self._winners.pop(name, None)
                if winner is not None:
                    self.incompatible[name] = winner.incompatible
            else:
                self.backends[name] = winner.spec
                self._winners[name] = winner
            for claim, reason in rejected:
                if claim in self._rejected:
                    continue
                self._rejected.add(claim)
                if (*claim.source, reason) not in reported:
                    reported.add((*claim.source, reason))
                    self._broken(claim.plugin, claim.distribution, reason)

    def _register_command(self, command: Any, plugin: str, dist: str | None) -> None:
        if not isinstance(command, Command):
            raise TypeError(f"register() takes a Command, got {type(command).__name__}")
        if command.name in CORE_COMMANDS:
            self._broken(plugin, dist, f"command {command.name!r} is genlm-core's own")
            return
        if command.name in self.commands:
            self._broken(plugin, dist, f"command {command.name!r} is already registered")
            return
        self.commands[command.name] = command
        self._command_plugins[command.name] = (plugin, dist)

    def command_failed(self, name: str, exc: BaseException) -> PluginLoadError:
        """Report a registered command that failed to set up (its ``configure`` raised):
        the CLI keeps the others, and ``genlm backends`` lists its plugin as broken."""
        plugin, dist = self._command_plugins.get(name, (name, None))
        return self._broken(
            plugin, dist, f"command {name!r} failed to set up: {describe(exc)}", exc
        )

    def _broken(
        self, plugin: str, dist: str | None, message: str, cause: BaseException | None = None
    ) -> PluginLoadError:
        error = PluginLoadError(
            f"plugin {plugin!r} ({dist or 'unknown distribution'}): {message}",
            plugin=plugin,
            distribution=dist,
        )
        error.__cause__ = cause
        logger.info("%s", error)
        self.errors.append(error)
        return error

    def _plugin_failed(
        self, plugin: str, dist: str | None, message: str, cause: BaseException | None = None
    ) -> None:
        """Report a plugin that failed to import, validate or register, and keep its
        distribution's backend names its own (see :func:`_arbitrate`)."""
        self._broken(plugin, dist, message, cause)
        if dist is not None:
            self._failed.add(_normalize(dist))

    # ---- choosing and loading ----------------------------------------------------------

    def select(
        self, backend: str | None = None, *, among: Collection[str] | None = None
    ) -> BackendSpec:
        """The spec for ``backend``, or the best usable one when None.

        Args:
            backend: a backend name (case-insensitive: names are lowercase), or None for
                auto-selection: the auto-selectable backend that can run here with the
                highest priority (ties by name).
            among: auto-select only from these names (a caller that can drive only some
                backends, like the genlm-backend facade); None for every backend.

        Returns:
            The chosen spec; nothing is imported.

        Raises:
            BackendNotFoundError: no backend has that name, or (None) none can run here.
            BackendUnavailableError: the named backend is installed but cannot run here,
                or was built for another plugin API.
            TypeError: ``backend`` is neither a string nor None.
            ValueError: ``backend`` is an empty string.
        """
        if backend is not None:
            # Bytes were looked up and suggested "pip install genlm-backend-b'mock'".
            if not isinstance(backend, str):
                raise TypeError(f"backend must be a backend name (str) or None, got {backend!r}")
            if not backend.strip():
                raise ValueError("backend is empty: name one, or pass None to choose one")
            name = backend.casefold()
            spec = self.backends.get(name)
            if spec is None and name in self.incompatible:
                raise BackendUnavailableError(str(self.incompatible[name]))
            if spec is None:
                raise BackendNotFoundError(self._not_found_message(backend))
            reason = spec.unavailable_reason()
            if reason is not None:
                raise BackendUnavailableError(f"backend {backend!r} cannot run here: {reason}")
            return spec
        usable, reasons = self._auto_candidates(among)
        if not usable:
            raise self._no_usable_backend(reasons)
        return usable[0]

    def load_model(self, model: str, backend: str | None = None, **opts: Any) -> Any:
        """Load ``model`` with ``backend``; see :func:`load_model_by_name`.

        With ``backend=None``, a chosen backend whose loader fails to import (a broken
        install) is skipped with a ``RuntimeWarning`` and the next usable one is tried.
        Errors from the loader itself (a bad model name, out of memory) propagate. What
        the loader returns must have every member of :class:`~genlm.core.AsyncLM`.

        Args:
            model: the model name, as for :func:`load_model_by_name`.
            backend: a backend name, or None to choose automatically.
            **opts: passed to the backend's loader unchanged.

        Returns:
            The loaded model.

        Raises:
            BackendNotFoundError: unknown backend, or no usable backend at all.
            BackendUnavailableError: the named backend cannot run here.
            ImportError: the named backend's loader cannot be imported (its module, one
                it imports, or the callable in it), whatever the module raised (a broken
                engine install may raise ``OSError`` or ``RuntimeError`` at import); the
                message names the backend, its plugin and distribution, the loader and the
                original error (the cause). An ``ImportError`` keeps its class (a missing
                dependency stays a ``ModuleNotFoundError``).
            BackendError: the loader returned something that is not a model.
        """
        if backend is not None:
            spec = self.select(backend)
            try:
                loader = spec.import_loader()
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # which backend, whose, what failed (SystemExit too)
                raise _import_error(
                    f"{self._culprit(spec)}: cannot import its loader {spec.loader}", exc
                ) from exc
            logger.info("loading %s with backend %s", model, spec.name)
            return self._checked(spec, loader(model, **opts))
        usable, reasons = self._auto_candidates()
        for spec in usable:
            try:
                loader = spec.import_loader()
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                reason = f"importing its loader {spec.loader} failed: {describe(exc)}"
                warnings.warn(
                    f"backend {spec.name!r} was chosen but {reason}; trying the next usable "
                    "backend",
                    RuntimeWarning,
                    stacklevel=3,
                )
                reasons.append(f"{spec.name}: {reason}")
                continue
            logger.info("loading %s with backend %s", model, spec.name)
            return self._checked(spec, loader(model, **opts))
        raise self._no_usable_backend(reasons)

    def _checked(self, spec: BackendSpec, lm: Any) -> Any:
        """``lm``, if it has every member of the ``AsyncLM`` protocol; else a
        ``BackendError`` naming the plugin, its distribution and what its loader returned."""
        from genlm.core._protocol import AsyncLM

        members = [n for n in vars(AsyncLM) if not n.startswith("_")]
        missing = [n for n in [*members, "__aenter__", "__aexit__"] if not hasattr(lm, n)]
        if not missing:
            return lm
        raise BackendError(
            f"{self._culprit(spec)}: its loader {spec.loader} returned {reprlib.repr(lm)} "
            f"({type(lm).__qualname__}), which is not a model: it lacks {', '.join(missing)} "
            "of genlm.core.AsyncLM"
        )

    def _culprit(self, spec: BackendSpec) -> str:
        """Names a backend in an error: its name, plugin and distribution (installed)."""
        claim = self._winners.get(spec.name)
        plugin = repr(claim.plugin) if claim is not None else "unknown"
        dist = (claim.distribution if claim is not None else None) or spec.distribution
        return f"backend {spec.name!r} (plugin {plugin}, distribution {dist})"

    def _auto_candidates(
        self, among: Collection[str] | None = None
    ) -> tuple[list[BackendSpec], list[str]]:
        """Auto-selectable backends (of ``among``, if given) that can run here, best first;
        and why the others cannot."""
        usable, reasons = [], []
        auto = (
            s
            for s in self.backends.values()
            if s.auto_select and (among is None or s.name in among)
        )
        ranked = sorted(auto, key=lambda s: (-s.priority, s.name))
        for spec in ranked:
            reason = spec.unavailable_reason()
            if reason is None:
                usable.append(spec)
            else:
                reasons.append(f"{spec.name}: {reason}")
        return usable, reasons

    def _no_usable_backend(self, reasons: list[str]) -> BackendNotFoundError:
        reasons = reasons + [str(e) for _, e in sorted(self.incompatible.items())]
        return BackendNotFoundError(
            f"no usable backend is {'loaded' if self.allowlist_note else 'installed'}"
            + (f" ({'; '.join(reasons)})" if reasons else "")
            + self._installed_hint()
            + (
                f"; {self.allowlist_note}"
                if self.allowlist_note
                else "; install one, e.g. pip install genlm-backend-hf"
            )
        )

    def _not_found_message(self, backend: str) -> str:
        if self.allowlist_note and backend.casefold() in {h.casefold() for h in self.hidden}:
            return f"backend {backend!r} is installed but not loaded: {self.allowlist_note}"
        name = backend.casefold()
        owner = owner_of(name)
        owner_broken = [  # the plugin of the distribution owning the name
            e
            for e in self.errors
            if e.distribution is not None and _normalize(e.distribution) == owner
        ]
        if name in self._lost and not owner_broken:  # installed, claimed, served by nobody
            return f"backend {backend!r} is installed but not served: {self._lost[name]}"
        # The owner's own failure says most; else a plugin by the name's entry point name.
        broken = owner_broken or [e for e in self.errors if e.plugin.casefold() == name]
        if broken:  # installed: a pip install would not help
            return f"backend {backend!r} is installed but its plugin failed to load: {broken[0]}"
        return (
            f"unknown backend {backend!r}"
            + self._installed_hint()
            + (f"; {self.allowlist_note}" if self.allowlist_note else "")
            + f"; to install it: pip install genlm-backend-{backend.casefold()}"
        )

    def _installed_hint(self) -> str:
        names = ", ".join(sorted(self.backends)) or "none"
        hint = f"; {'loaded' if self.allowlist_note else 'installed'} backends: {names}"
        if self.errors:
            hint += "; broken plugins: " + ", ".join(sorted({e.plugin for e in self.errors}))
        return hint


def _from(
    register: Callable, plugin: str, dist: str | None, given: list[Any]
) -> Callable[[Any], None]:
    """A register callback that remembers which plugin is calling, and adds each item to
    ``given``, so that a plugin that registers nothing is seen."""

    def register_from_plugin(item: Any) -> None:
        given.append(item)
        register(item, plugin, dist)

    return register_from_plugin


def _import_error(context: str, exc: BaseException) -> ImportError:
    """An ``ImportError`` saying ``context: <exc>``: of ``exc``'s class when it is an
    ``ImportError`` (a missing dependency stays a ``ModuleNotFoundError``, with its
    ``name`` and ``path``), else a plain one that shows the original's class
    (``RuntimeError('...')``), since a module that raises at import failed to import."""
    if isinstance(exc, ImportError):
        try:
            return type(exc)(f"{context}: {exc}", name=exc.name, path=exc.path)
        except Exception:  # noqa: BLE001 - a plugin's subclass that cannot show or remake itself
            pass
    return ImportError(f"{context}: {describe(exc)}")


def _registered_nothing(module: Any, hooks: list[str], implemented: list[str]) -> str:
    """Why a plugin that loaded registered nothing, for its error (``hooks``: the hooks a
    plugin may implement; ``implemented``: those pluggy found in ``module``).

    Every legitimate plugin registers something (a backend plugin its backends, a command
    plugin its commands; a backend that cannot run on this machine is still registered,
    its probe saying why), so one that registers nothing is broken, and reporting it keeps
    a user from being told to ``pip install`` what is installed. The usual cause is a
    hook function without pluggy's marker, which pluggy skips without a word.
    """
    unmarked = [  # read statically: a module's __getattr__ may raise anything
        h
        for h in hooks
        if h not in implemented and callable(inspect.getattr_static(module, h, None))
    ]
    if unmarked:
        why = (
            f"its {' and '.join(unmarked)} is not marked with genlm.core.hookspecs.hookimpl, "
            "so it is never called (make it with backend_hook(...) or command_hook(...), or "
            "decorate it with @hookimpl)"
        )
    elif implemented:
        why = f"its {' and '.join(implemented)} never called register"
    else:  # perhaps only hooks of a newer genlm-core
        why = (
            f"it implements neither {' nor '.join(hooks)} (a plugin written for a newer "
            "genlm-core may implement only hooks this one does not have: upgrade genlm-core)"
        )
    return f"it registered no backend or command: {why}"


_registry: Registry | None = None


def get_registry(refresh: bool = False) -> Registry:
    """The process-wide registry, discovered on first use.

    Args:
        refresh: discover again (after installing a plugin, or in tests).

    Returns:
        The shared :class:`Registry`.
    """
    global _registry
    if _registry is None or refresh:
        _registry = Registry.discover()
    return _registry


def load_model_by_name(name: str, backend: str | None = None, **opts: Any) -> Any:
    """Load model ``name`` (a hub id, a local path, or ``"stories260K"``) with a backend.

    ``backend=None`` picks the best usable installed backend: vllm with a CUDA GPU,
    mlx on Apple silicon, else hf. If the chosen backend's code fails to import (a
    broken install), a ``RuntimeWarning`` says so and the next usable backend is used.

    Args:
        name: the model: a Hugging Face hub id, a local directory, or an embedded
            model's name (``"stories260K"`` loads offline).
        backend: a backend name (``"hf"``, ``"vllm"``, ``"mlx"``, ``"mock"`` or a
            third-party one; case-insensitive), or None to choose automatically.
        **opts: passed to the backend's loader unchanged (e.g. ``max_batch_size``).

    Returns:
        The loaded model, an :class:`~genlm.core.AsyncLM` (a :class:`~genlm.core.backend.BatchedLM`
        for every bundled backend).

    Raises:
        BackendNotFoundError: the backend is not installed (the message lists the
            installed ones and the ``pip install`` to run), or no backend can run here;
            when ``GENLM_BACKENDS`` hid plugins, the message names its value and them.
        BackendUnavailableError: it is installed but cannot run on this machine.
        ImportError: the named backend's code cannot be imported (the message names the
            backend, its plugin and distribution, and its loader).
        BackendError: the loader returned something that is not an ``AsyncLM``.
        TypeError, ValueError: ``backend`` is not a string (or None), or is empty.
    """
    return get_registry().load_model(name, backend, **opts)
