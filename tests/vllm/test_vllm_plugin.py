"""The vllm plugin: cheap to import, registered, honest about where it can run."""

from __future__ import annotations

import importlib.metadata
import os
import sys

import pytest
from support.imports import modules_loaded_by

from genlm.backends.vllm import plugin
from genlm.backends.vllm._model import MULTIPROCESSING_ENV, in_process_sampler
from genlm.core.backend import Registry


def registry():
    reg = Registry()
    reg.register_plugins([("vllm", "genlm-backend-vllm", plugin)])
    return reg


def test_plugin_import_pulls_in_neither_torch_nor_vllm():
    """Importing the plugin module loads no heavy library."""
    heavy = ("torch", "vllm", "transformers")
    assert modules_loaded_by("import genlm.backends.vllm.plugin", heavy) == []


def test_the_package_has_the_distributions_version():
    """``genlm.backends.vllm.__version__`` is the installed distribution's, as hf's and mlx's."""
    import genlm.backends.vllm

    assert genlm.backends.vllm.__version__ == importlib.metadata.version("genlm-backend-vllm")
    assert "__version__" in dir(genlm.backends.vllm) and "VLLMLM" in dir(genlm.backends.vllm)


def test_loading_without_vllm_names_vllm_and_its_install(monkeypatch):
    """VLLMLM.from_name without vllm is an ImportError naming vllm and what to pip install
    (the plugin's own reason), where it failed on the first import it met (transformers, in
    an install without the gpu extra, or vllm's internals)."""
    from genlm.backends.vllm import VLLMLM

    monkeypatch.setitem(sys.modules, "vllm", None)  # not installed: find_spec is None
    with pytest.raises(ImportError) as error:
        VLLMLM.from_name("stories260K")
    assert "vllm is not installed" in str(error.value)
    assert "pip install 'genlm-backend-vllm[gpu]'" in str(error.value)


def test_registered_with_priority_and_gpu_gated_auto_selection():
    """vllm registers at priority 30; auto-selection only with a CUDA GPU; loadable by name here."""
    reg = registry()
    spec = reg.backends["vllm"]
    assert spec.priority == 30
    assert spec.auto_select is plugin.cuda_gpu_present()
    assert spec.unavailable_reason() is None  # vllm(-cpu) is importable in this venv
    assert reg.select("vllm") is spec


@pytest.mark.parametrize(
    ("gpus", "devices", "wsl", "visible", "present"),
    [
        (1, 0, False, None, True),
        (0, 1, False, None, True),
        (1, 1, False, "0", True),
        (2, 2, False, "1", True),
        (1, 1, False, "1", False),
        (1, 1, False, "GPU-5ca1ab1e", True),
        (1, 1, False, "", False),
        (1, 1, False, "-1", False),
        (1, 1, False, " -1,0", False),
        (0, 0, False, None, False),
        (0, 0, True, None, True),
        (0, 0, True, "0", True),
        (0, 0, True, "", False),
    ],
)
def test_a_gpu_is_present_when_the_driver_lists_one_this_process_may_see(
    tmp_path, monkeypatch, gpus, devices, wsl, visible, present
):
    """A GPU counts when the driver lists one (its /proc list, a /dev/nvidiaN file) or WSL 2
    exposes one with NVIDIA's CUDA library, and CUDA_VISIBLE_DEVICES' first entry names one
    (an index below the count, a UUID); the driver's tools on the PATH (an nvidia-smi that
    finds no GPU) and its /proc folder alone do not (vllm was auto-selected on such
    machines)."""
    listed = tmp_path / "gpus"
    listed.mkdir()
    for i in range(gpus):
        (listed / f"0000:0{i}:00.0").mkdir()
    for i in range(devices):
        (tmp_path / f"nvidia{i}").touch()
    (tmp_path / "nvidiactl").touch()  # the driver's control file is no GPU
    (tmp_path / "nvidia-smi").touch(mode=0o755)
    if wsl:
        (tmp_path / "dxg").touch()
        (tmp_path / "libcuda.so.1").touch()
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(plugin, "GPU_LIST", str(listed))
    monkeypatch.setattr(plugin, "DEVICE_FILES", str(tmp_path / "nvidia[0-9]*"))
    monkeypatch.setattr(plugin, "WSL_DEVICE", str(tmp_path / "dxg"))
    monkeypatch.setattr(plugin, "WSL_CUDA", str(tmp_path / "libcuda.so*"))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert plugin.cuda_gpu_present() is present
    assert plugin.spec().auto_select is present


def test_probe_names_the_missing_package(monkeypatch):
    """Without vllm the probe says so and how to install it."""
    monkeypatch.setattr(plugin.importlib.util, "find_spec", lambda name: None)
    assert "vllm is not installed" in plugin.unavailable_reason()


def test_fast_route_conditions_name_what_prevents_them():
    """The in-process route needs vLLM's multiprocessing off and one model process."""
    assert in_process_sampler({}, multiprocessing=False) is None
    assert MULTIPROCESSING_ENV in in_process_sampler({}, multiprocessing=True)
    assert "parallel" in in_process_sampler({"tensor_parallel_size": 2}, multiprocessing=False)
    ray = {"distributed_executor_backend": "ray"}
    assert "uni" in in_process_sampler(ray, multiprocessing=False)


def test_the_chosen_route_is_logged_with_its_reason(monkeypatch, caplog):
    """At load, 'auto' logs the route it takes; the slow route is a warning, naming the
    variable, when vLLM's default multiprocessing is all that blocks the fast one."""
    import logging

    import vllm.envs

    from genlm.backends.vllm._model import VLLMLM

    caplog.set_level(logging.INFO, logger="genlm.backends.vllm")
    monkeypatch.setattr(vllm.envs, "VLLM_ENABLE_V1_MULTIPROCESSING", True, raising=False)
    assert VLLMLM._choose_row_source("auto", {}) == "logprobs"
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and f"{MULTIPROCESSING_ENV}=0" in record.message
    caplog.clear()
    assert VLLMLM._choose_row_source("auto", {"tensor_parallel_size": 2}) == "logprobs"
    (record,) = caplog.records
    assert record.levelno == logging.INFO and "parallel" in record.message
    assert MULTIPROCESSING_ENV not in record.message  # setting it would not help
    caplog.clear()
    monkeypatch.setattr(vllm.envs, "VLLM_ENABLE_V1_MULTIPROCESSING", False, raising=False)
    assert VLLMLM._choose_row_source("auto", {}) == "processor"
    (record,) = caplog.records
    assert record.levelno == logging.INFO and "fast" in record.message
