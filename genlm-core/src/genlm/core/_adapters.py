"""Named LoRA adapters a backend serves as request variants: ``AdapterTable`` and the
``LoraAdapters`` mixin.

What every backend with adapters keeps the same way, so that hf, vllm and mlx agree on it:
which names are loaded and which is active (the default variant of new requests), the
errors for an unknown name, and removal: a request for a removed adapter that has not run
fails instead of running under another one, cached rows go (they are keyed by name, and a
name may be loaded again), and no later request joins a computation still running under
the removed adapter. How an adapter is loaded, applied to a batch and freed is each
backend's own (peft, vLLM's ``LoRARequest``, mlx-lm's LoRA layers).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Collection, Hashable
from typing import Any, Generic, TypeVar

from genlm.core._errors import UnknownVariantError

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

    def check_new(self, name: str) -> None:
        """Check ``name`` for a new adapter before loading it (where loading costs).

        Raises:
            TypeError: ``name`` is not a string (None names the base model).
            ValueError: it is empty, or an adapter of that name is loaded.
        """
        if not isinstance(name, str):
            raise TypeError(
                f"a LoRA adapter's name is a string, got {name!r} ({type(name).__name__})"
                + ("; None names the base model" if name is None else "")
            )
        if not name:
            raise ValueError("a LoRA adapter's name must not be empty")
        if name in self._values:
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
    ``set_lora``, ``clear_lora``, ``active_lora``, ``loaded_loras`` and ``remove_lora``.
    The backend stores each adapter it loads with ``adapters.add(name, value)``, finds it
    for a batch with ``adapters.get(variant)``, and implements :meth:`_release_adapter`
    (worker thread) to free one that was removed.

    Attributes:
        adapters (AdapterTable): the loaded adapters and the active one.
    """

    adapters: AdapterTable[Any]
    # What the mixin uses of the BatchedLM it is mixed into.
    worker: Any
    output_cache: Any
    batcher: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.adapters = AdapterTable()
        super().__init__(*args, **kwargs)

    def set_lora(self, name: str) -> None:
        """Make the loaded adapter ``name`` active for the requests made from now on
        (requests made before keep the adapter they were made with).

        Raises:
            UnknownVariantError: no adapter named ``name`` is loaded (a ``KeyError``);
                None names none (:meth:`clear_lora` selects the base model).
        """
        if name is None:
            raise UnknownVariantError(
                "no LoRA adapter named None; clear_lora() selects the base model"
            )
        self.adapters.activate(name)

    def clear_lora(self) -> None:
        """Use the base model (no adapter) for the requests made from now on."""
        self.adapters.activate(None)

    @property
    def active_lora(self) -> str | None:
        """The name of the adapter new requests use, or None for the base model."""
        return self.adapters.active

    @property
    def loaded_loras(self) -> tuple[str, ...]:
        """The names of the loaded adapters, in the order they were loaded."""
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
        """
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
        """Free what the removed adapter ``name`` held (worker thread): its weights, its
        KV. A backend with adapters implements it."""
        raise NotImplementedError
