"""The exceptions GenLM raises.

Each refines a builtin (``ValueError``, ``RuntimeError``, ``ImportError``) so that
existing ``except`` clauses keep working::

    GenLMError
    ├── InvalidContextError (ValueError)      bad token ids in a request
    ├── VocabularyMismatchError (ValueError)  two components disagree on the vocabulary
    ├── BackendNotFoundError (ValueError)     unknown or uninstalled backend
    ├── BackendUnavailableError (RuntimeError) installed, but cannot run here
    ├── PluginLoadError (ImportError)         a plugin failed to import or register
    ├── BackendError (RuntimeError)           a backend broke its contract (a batch, a loader)
    └── ModelClosedError (RuntimeError)       the model was closed with ``aclose()``
"""

from __future__ import annotations


class GenLMError(Exception):
    """Base class of every error GenLM raises on purpose."""


class InvalidContextError(GenLMError, ValueError):
    """A request's token ids are unusable: empty, not integers, or out of range."""


class VocabularyMismatchError(GenLMError, ValueError):
    """Two components (a model and a trie, say) were built over different vocabularies."""


class BackendNotFoundError(GenLMError, ValueError):
    """No installed backend has the requested name."""


class BackendUnavailableError(GenLMError, RuntimeError):
    """The backend is installed but cannot run on this machine (no GPU, wrong platform)."""


class PluginLoadError(GenLMError, ImportError):
    """A plugin distribution failed to import or to register its backends.

    Not raised by discovery: each one is collected in ``Registry.errors`` (and shown by
    ``genlm backends``), so one broken plugin never stops the others. ``plugin`` is the
    entry point name, ``distribution`` the pip distribution that declared it (None if
    unknown).
    """

    def __init__(self, message: str, *, plugin: str, distribution: str | None = None):
        super().__init__(message)
        self.plugin = plugin
        self.distribution = distribution


class BackendError(GenLMError, RuntimeError):
    """A backend broke its contract: its loader returned something that is not a model,
    or it failed while computing a batch.

    Loading: ``load_model_by_name`` raises it, naming the plugin, its distribution and
    what the loader returned, when that lacks a member of :class:`~genlm.core.AsyncLM`.

    A request: raised when it is made if the backend's ``_variant()`` hook returns
    something unhashable (a dict), which cannot be part of a cache key.

    A batch: raised to every waiter of that batch (nothing of it is cached) when the
    backend returns rows of the wrong shape or type, rows that are not log-probabilities
    (NaN, ``+inf``, every entry ``-inf``, visibly unnormalized), or raises an exception
    that cannot travel through a future (``StopIteration``, ``KeyboardInterrupt``,
    ``SystemExit``...): that exception is then the ``__cause__``. The model keeps serving.
    """


class UnknownVariantError(GenLMError, KeyError, ValueError):
    """A request or ``set_lora`` named a variant (a LoRA adapter) the model has not
    loaded. Both a ``KeyError`` (GenLM's documented error: no such key among the loaded
    adapters) and a ``ValueError`` (what genlm-backend 0.3.1 raised), so code written for
    either catches it."""

    def __str__(self) -> str:  # the message itself, not KeyError's repr of it
        return str(self.args[0]) if self.args else ""


class ModelClosedError(GenLMError, RuntimeError):
    """The model was closed; create a new one to make further requests."""


def describe(exc: BaseException) -> str:
    """``repr(exc)``, or a stand-in naming its class when that raises: what every report of
    a plugin's failure shows, since a plugin's exception may be unable to show itself (its
    ``__repr__`` or ``__str__`` raising), and that must not break discovery or the CLI."""
    try:
        return repr(exc)
    except Exception as inner:  # noqa: BLE001 - a plugin's __repr__ may raise anything
        return f"{type(exc).__qualname__} (whose repr raised {type(inner).__name__})"
