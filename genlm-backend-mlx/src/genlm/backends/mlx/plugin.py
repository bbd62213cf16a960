"""Registers the ``mlx`` backend. Cheap to import: only genlm.core and the standard library."""

from __future__ import annotations

import importlib.util
import platform

from genlm.core.backend import BackendSpec, backend_hook


def is_apple_silicon() -> bool:
    """Whether this is a Mac with an Apple-silicon (arm64) processor, where MLX uses the GPU."""
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def unavailable_reason() -> str | None:
    """None when mlx and mlx_lm are importable, else what to install.

    Only importability is checked, so ``backend="mlx"`` works wherever MLX installs (Linux
    CPU included); whether ``backend=None`` may pick MLX is decided by the platform at
    registration (``auto_select``).
    """
    missing = [name for name in ("mlx", "mlx_lm") if importlib.util.find_spec(name) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (pip install genlm-backend-mlx)"
    return None


def spec() -> BackendSpec:
    """The mlx backend's spec; made at each registration, when the platform is read."""
    return BackendSpec(
        name="mlx",
        loader="genlm.backends.mlx._model:MLXLM.from_name",
        distribution="genlm-backend-mlx",
        plugin_api=1,
        probe="genlm.backends.mlx.plugin:unavailable_reason",
        priority=20,
        auto_select=is_apple_silicon(),
        description="Apple MLX via mlx-lm (auto-selected on Apple silicon; CPU elsewhere)",
    )


genlm_register_backends = backend_hook(spec)
