"""Loading the model a command names, with every user mistake caught before loading.

Model loaders of the hub-based backends fail late and loudly: an unknown model name
costs a minute of retried hub requests and a long traceback. Here a name is checked
first, cheaply: an embedded model is fine; a local path (one starting with ``/``,
``.`` or ``~``, or with more separators than a hub id has) must exist; a hub id, for
the backends that load from the Hugging Face hub, must be in the local cache, or be
found by one hub request, whose failure is reported once.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from genlm.core.cli._errors import CLIError, one_line

T = TypeVar("T")

#: Backends whose loaders resolve model names on the Hugging Face hub.
HUB_BACKENDS = frozenset({"hf", "vllm", "mlx"})
#: Seconds the one hub request may take.
HUB_TIMEOUT_S = 10.0


def select_backend(backend: str | None):
    """The ``BackendSpec`` to load with, or a ``CLIError`` that says how to get one.

    When no backend was named and none can be picked automatically, the message lists
    the installed backends that run here but are never picked automatically (mlx off
    Apple silicon), with the ``--backend`` to pass.
    """
    from genlm.core._errors import BackendNotFoundError, BackendUnavailableError
    from genlm.core._registry import get_registry

    registry = get_registry()
    try:
        return registry.select(backend)
    except BackendUnavailableError as exc:
        raise CLIError(one_line(exc)) from exc
    except BackendNotFoundError as exc:
        message = one_line(exc)
        if backend is None:
            manual = sorted(
                name
                for name, spec in registry.backends.items()
                if not spec.auto_select and spec.unavailable_reason() is None
            )
            if manual:
                choices = " or ".join(f"--backend {name}" for name in manual)
                message += f"; installed but never picked automatically: pass {choices}"
        raise CLIError(message) from exc


def check_model(name: str, backend: str) -> str:
    """``name`` as the loader should get it (``~`` expanded), after the checks that need no
    model: a ``CLIError`` for a missing local path, or a hub id neither cached nor found."""
    from genlm.core._embedded import EMBEDDED_MODELS, resolve_model_path

    if name in EMBEDDED_MODELS:
        return name
    path = os.path.expanduser(name)
    if os.path.exists(path):
        return path
    try:  # the loaders' own rule: a name that can only be a local path must exist
        resolve_model_path(name)
    except FileNotFoundError as exc:
        raise CLIError(str(exc)) from None
    if backend in HUB_BACKENDS:
        _check_hub_model(name)
    return name


def _check_hub_model(name: str) -> None:
    try:
        import huggingface_hub
        from huggingface_hub import constants, errors
    except ImportError:  # the loader will say what is missing
        return
    try:
        cached = huggingface_hub.try_to_load_from_cache(name, "config.json")
    except errors.HFValidationError as exc:
        raise CLIError(f"{name!r} is not a local path nor a valid hub model id") from exc
    if isinstance(cached, str):
        return
    where = f"model {name!r} is not embedded, not a local path and not in the Hugging Face cache"
    if constants.HF_HUB_OFFLINE:
        raise CLIError(f"{where}, and HF_HUB_OFFLINE is set so the hub is not asked")
    try:
        huggingface_hub.model_info(name, timeout=HUB_TIMEOUT_S)
    except errors.GatedRepoError as exc:
        raise CLIError(f"model {name!r} is gated on the hub: log in (hf auth login)") from exc
    except errors.RepositoryNotFoundError as exc:
        raise CLIError(f"no model {name!r} on the Hugging Face hub") from exc
    except Exception as exc:  # network errors come from several libraries
        raise CLIError(
            f"{where}, and the hub at {constants.ENDPOINT} cannot be reached "
            f"({one_line(exc)}); set HF_HUB_OFFLINE=1 to use cached models only"
        ) from exc


def load_model(model: str, backend: str | None, *, progress: bool = True, **opts: Any) -> Any:
    """Check the backend and the model name, then load the model with that backend.

    What a command plugin calls to load the model its user named (``genlm bytes`` does):
    a mistake becomes a :class:`~genlm.core.cli.CLIError` before anything heavy loads.
    With ``backend=None``, as :func:`~genlm.core.load_model_by_name`: a chosen backend
    whose code fails to import is skipped with a warning for the next usable one.
    Call it before the command's event loop starts (see :func:`run_with`): a Ctrl-C
    during a load then stops it at once.

    ``progress=False`` (a command's ``--no-progress``) hides the loaders' own bars too:
    the Hugging Face libraries' (transformers' "Loading weights", downloads), which
    read ``HF_HUB_DISABLE_PROGRESS_BARS`` when they are imported, as they are after this
    point in a ``genlm`` command (a value the user set is kept).
    """
    from genlm.core._registry import get_registry

    if not progress:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for option, value in (("--model", model), ("--backend", backend)):
        if value is not None and not value.strip():
            raise CLIError(f"{option} is empty: name one, or leave the option out")
    spec = select_backend(backend)
    name = check_model(model, spec.name)
    return get_registry().load_model(name, None if backend is None else spec.name, **opts)


def run_with(lm: Any, main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, a command's work on the model ``lm`` it loaded before, which
    ``main`` closes (``async with lm``); closed here too if ``main`` did not get to (a
    Ctrl-C before it started, a failure). Loading outside the event loop is what lets a
    Ctrl-C stop a load at once: ``asyncio.run`` turns it into a cancellation of its task,
    which a load running inside the task, with no ``await``, would see only at its end."""
    try:
        return asyncio.run(main)
    except BaseException:
        main.close()  # never started (a Ctrl-C at once): no "never awaited" warning
        asyncio.run(lm.aclose())  # closing twice is a no-op
        raise
