"""Named LoRA adapters a backend serves as request variants: ``AdapterTable`` and the
``LoraAdapters`` mixin.

What every backend with adapters keeps the same way, so that hf, vllm and mlx agree on it:
which names are loaded and which is active (the default variant of new requests), the
errors for an unknown name, and removal: a request for a removed adapter that has not run
fails instead of running under another one, cached rows go (they are keyed by name, and a
name may be loaded again), and no later request joins a computation still running under
the removed adapter. Replacing one (``add_lora(..., replace=True)``) is removal in one
step with storing its successor, done only once the successor has loaded, so a load that
fails leaves the adapter it was to replace as it was. A closed model serves no adapter:
close forgets them all (the backend's release frees what they held), and the adapter calls
then raise :class:`~genlm.core.ModelClosedError`. How an adapter is loaded, applied to a
batch and freed is each backend's own (peft, vLLM's ``LoRARequest``, mlx-lm's LoRA
layers).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Collection, Hashable
from typing import Any, Generic, TypeVar

from genlm.core._errors import ModelClosedError, UnknownVariantError

__all__ = ["AdapterTable", "LoraAdapters"]

A = TypeVar("A")


class AdapterTable(Generic[A]):
    """The loaded adapters of one model, by name, each with the value its backend keeps
    for it (what a batch needs to apply it: a KV marker, an engine request, weights), and
    the active one.

    Attributes:
        active: the name of the adapter new requests use by default, or None for the base
            model.
    """

    def __init__(self) -> None:
        self._values: dict[str, A] = {}
        self.active: str | None = None
        #: Held while an adapter is added or removed: a name is loaded once, whatever the
        #: threads asking.
        self._lock = threading.Lock()
        self._markers = itertools.count(-2, -1)

    def new_marker(self) -> int:
        """A number for a new adapter's KV entries (their first key element), none of
        this model's adapters had before: -2, -3, ... (-1 is left to the base model), so a
        name loaded again never meets the KV of the adapter it replaced."""
        return next(self._markers)

    @property
    def names(self) -> tuple[str, ...]:
        """The loaded adapters' names, in the order they were loaded."""
        return tuple(self._values)

    def served(self) -> Collection[str]:
        """A live view of the loaded names (what ``_served_variants`` returns)."""
        return self._values.keys()

    def check_new(self, name: str, replace: bool = False) -> None:
        """Check ``name`` for a new adapter before loading it (where loading costs);
        with ``replace``, an adapter of that name may be loaded (the new one is to take its
        place).

        Raises:
            TypeError: ``name`` is not a string (None names the base model).
            ValueError: it is empty, or an adapter of that name is loaded (without
                ``replace``).
        """
        if not isinstance(name, str):
            raise TypeError(
                f"a LoRA adapter's name is a string, got {name!r} ({type(name).__name__})"
                + ("; None names the base model" if name is None else "")
            )
        if not name:
            raise ValueError("a LoRA adapter's name must not be empty")
        if name in self._values and not replace:
            raise ValueError(f"a LoRA adapter named {name!r} is already loaded")

    def check_loaded(self, name: str) -> None:
        """Raise :class:`~genlm.core.UnknownVariantError` unless adapter ``name`` is loaded."""
        if name not in self._values:
            raise UnknownVariantError(
                f"no LoRA adapter named {name!r}; loaded: {sorted(self._values)}"
            )

    def add(self, name: str, value: A) -> None:
        """Store a loaded adapter under ``name``.

        Raises:
            TypeError, ValueError: as :meth:`check_new`.
        """
        with self._lock:
            self.check_new(name)
            self._values[name] = value

    def replace(self, name: str, value: A) -> list[A]:
        """Store ``value`` under ``name`` as the adapter loaded last, in place of the one
        loaded under ``name``, if any (it stays active if it was: the name still names a
        loaded adapter). Returns the values replaced, in a list (none or one: a stored
        value may itself be None).

        Raises:
            TypeError, ValueError: ``name`` is not a valid name (as :meth:`check_new`).
        """
        with self._lock:
            self.check_new(name, replace=True)
            replaced = [self._values.pop(name)] if name in self._values else []
            self._values[name] = value
            return replaced

    def get(self, variant: Hashable) -> A:
        """The value stored for a batch's adapter ``variant``.

        Raises:
            UnknownVariantError: it was removed after the request was made.
        """
        try:
            return self._values[variant]  # type: ignore[index]
        except KeyError:
            raise UnknownVariantError(
                f"the LoRA adapter {variant!r} was removed before this request ran"
            ) from None

    def activate(self, name: str | None) -> None:
        """Make ``name`` the active adapter (None: the base model), checked and set at once
        (an adapter removed meanwhile never becomes active).

        Raises:
            UnknownVariantError: no adapter named ``name`` is loaded.
        """
        with self._lock:
            if name is not None:
                self.check_loaded(name)
            self.active = name

    def clear(self) -> None:
        """Forget every adapter (a closed model's, whose values may hold memory)."""
        with self._lock:
            self._values.clear()
            self.active = None

    def pop(self, name: str) -> A:
        """Forget ``name`` (the base model becomes active if it was); its value.

        Raises:
            KeyError: ``name`` is not loaded.
        """
        with self._lock:
            value = self._values.pop(name)
            if self.active == name:
                self.active = None
            return value


class LoraAdapters:
    """A mixin for a :class:`~genlm.core.backend.BatchedLM` with named LoRA adapters.

    Listed before ``BatchedLM`` among the bases (``class MyLM(LoraAdapters, BatchedLM)``),
    it gives the model an :class:`AdapterTable` (:attr:`adapters`), serves ``_variant``
    (the active adapter) and ``_served_variants`` (the loaded ones), and adds
    ``add_lora``, ``set_lora``, ``clear_lora``, ``active_lora``, ``loaded_loras`` and
    ``remove_lora``. The backend implements :meth:`_load_adapter` (worker thread), whose
    value ``add_lora`` stores, finds that value for a batch with
    ``adapters.get(variant)``, and implements :meth:`_release_adapter` (worker thread) to
    free an adapter removed or replaced. At close, the table is emptied after the
    backend's ``_close_backend``, which frees what every adapter held.

    Attributes:
        adapters (AdapterTable): the loaded adapters and the active one.
    """

    adapters: AdapterTable[Any]
    # What the mixin uses of the BatchedLM it is mixed into.
    name: str
    worker: Any
    output_cache: Any
    batcher: Any
    _closed: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.adapters = AdapterTable()
        super().__init__(*args, **kwargs)

    def add_lora(self, path: Any, name: str, *, replace: bool = False) -> None:
        """Load the adapter saved at ``path`` as ``name``; it does not become active.

        With ``replace``, an adapter already loaded as ``name`` is replaced, only once the
        new one has loaded: a load that fails leaves it loaded and serving (the error
        propagates). Then the name serves the new adapter (active if the old one was),
        requests for it not yet run run under the new one, cached rows are dropped, and
        the old adapter is released as :meth:`remove_lora` releases one.

        Raises:
            TypeError, ValueError: ``name`` is not a string or is empty; without
                ``replace``, an adapter of that name is loaded (checked again on the
                worker: of two callers loading one name, one gets it, the other this).
            ModelClosedError: the model is closed.
            Exception: what loading raised; with ``replace``, what releasing the
                replaced adapter raised (the new one is loaded then).
        """
        self._check_open()
        self.adapters.check_new(name, replace)
        self.worker.call(self._add_adapter, path, name, replace)

    def _add_adapter(self, path: Any, name: str, replace: bool) -> None:
        """Worker side of :meth:`add_lora`, where no batch runs meanwhile. A replacement
        closes the computations in flight to later requests and drops the cached rows
        (keyed by the name, which now serves the new adapter) before the swap, as
        :meth:`_remove_adapter` does before forgetting a name; a name not loaded has
        neither."""
        self.adapters.check_new(name, replace)
        value = self._load_adapter(path, name)
        if not (replace and name in self.adapters.served()):
            self.adapters.add(name, value)
            return
        self.batcher.refuse_joins()
        self.output_cache.clear()
        for old in self.adapters.replace(name, value):
            self._release_adapter(name, old)

    def _load_adapter(self, path: Any, name: str) -> Any:
        """Load the adapter saved at ``path``, to be stored as ``name`` (worker thread),
        and return what a batch needs to apply it and its release to free it (a KV
        marker, an engine request, weights). An adapter of that name may be loaded still
        (a replacement): the new one must load beside it. A load that fails must leave
        the model as it was. A backend with adapters implements it."""
        raise NotImplementedError(
            f"{type(self).__qualname__} cannot load LoRA adapters: it implements neither "
            "_load_adapter nor its own add_lora"
        )

    def set_lora(self, name: str) -> None:
        """Make the loaded adapter ``name`` active for the requests made from now on
        (requests made before keep the adapter they were made with).

        Raises:
            UnknownVariantError: no adapter named ``name`` is loaded (a ``KeyError``);
                None names none (:meth:`clear_lora` selects the base model).
            ModelClosedError: the model is closed.
        """
        self._check_open()
        if name is None:
            raise UnknownVariantError(
                "no LoRA adapter named None; clear_lora() selects the base model"
            )
        self.adapters.activate(name)

    def clear_lora(self) -> None:
        """Use the base model (no adapter) for the requests made from now on.

        Raises:
            ModelClosedError: the model is closed.
        """
        self._check_open()
        self.adapters.activate(None)

    @property
    def active_lora(self) -> str | None:
        """The name of the adapter new requests use, or None for the base model (also
        once the model is closed)."""
        return self.adapters.active

    @property
    def loaded_loras(self) -> tuple[str, ...]:
        """The names of the loaded adapters, in the order they were loaded (none once the
        model is closed)."""
        return self.adapters.names

    def _variant(self) -> Hashable:
        return self.adapters.active

    def _served_variants(self) -> Collection[Hashable]:
        """A per-request ``variant=`` names a loaded adapter."""
        return self.adapters.served()

    def remove_lora(self, name: str) -> None:
        """Unload the adapter ``name`` and drop the cached rows (the output cache is
        cleared: rows are keyed by adapter name, and the name may be loaded again). If it
        was active, the base model becomes active. A request for it that has not run yet
        fails with :class:`~genlm.core.UnknownVariantError` (unless the name is loaded
        again first: it then runs under the new adapter), and a request made afterwards
        never shares a computation in flight under this one.

        Raises:
            UnknownVariantError: no adapter named ``name`` is loaded.
            ModelClosedError: the model is closed.
            Exception: what the backend's release raised (the name is forgotten all the
                same: an adapter released in part is not served).
        """
        self._check_open()
        self.adapters.check_loaded(name)
        self.worker.call(self._remove_adapter, name)

    def _remove_adapter(self, name: str) -> None:
        """Worker side of :meth:`remove_lora`, where no batch runs meanwhile: close the
        computations in flight to later requests and drop the cached rows, then forget
        ``name`` and release it. In that order, a request made once the name is gone (or
        loaded again, from another thread) can neither join a computation nor read a row
        made under the adapter removed."""
        self.batcher.refuse_joins()
        self.output_cache.clear()  # also keeps out the rows of a batch delivered later
        try:
            value = self.adapters.pop(name)
        except KeyError:  # removed meanwhile by another caller
            return
        self._release_adapter(name, value)

    def _release_adapter(self, name: str, value: Any) -> None:
        """Free what the removed or replaced adapter ``name`` held (worker thread): its
        weights, its KV. A backend with adapters implements it."""
        raise NotImplementedError

    def _close_on_worker(self) -> None:
        """Forget every adapter after the backend's release, even if that failed: a closed
        model serves none, and their values may hold memory (the backend's
        ``_close_backend`` freed what it loaded, the model and its adapters whole)."""
        try:
            super()._close_on_worker()  # type: ignore[misc]
        finally:
            self.adapters.clear()

    def _check_open(self) -> None:
        """Raise :class:`~genlm.core.ModelClosedError` if the model is closed (or closing:
        its adapters are about to be forgotten)."""
        if self._closed:
            raise ModelClosedError(f"{self.name} is closed")
