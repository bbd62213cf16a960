"""Closing a vLLM engine frees what a second engine in the same process needs: the engine's
last references, vLLM's model-parallel state, and cached CUDA memory (CUDA itself is
checked on a GPU only; here the calls and their order are)."""

from __future__ import annotations

import gc
import json
import textwrap
import weakref
from types import SimpleNamespace

import pytest

from genlm.backends.vllm import _model
from genlm.backends.vllm._capture import RowSink
from genlm.backends.vllm._sessions import SessionTable


class FakeLLM:
    """Stands for ``vllm.LLM``: records its engine core's shutdown."""

    def __init__(self, calls: list[str], fail: bool = False):
        def shutdown():
            calls.append("shutdown")
            if fail:
                raise RuntimeError("shutdown failed")

        self.llm_engine = SimpleNamespace(engine_core=SimpleNamespace(shutdown=shutdown))


def closing_model(llm: FakeLLM) -> _model.VLLMLM:
    lm = object.__new__(_model.VLLMLM)  # only the state _close_backend touches
    lm.llm, lm._sink, lm._sessions = llm, RowSink(), SessionTable(0)
    lm._live, lm._answered = {}, {}
    lm._sink.put("row", object())
    return lm


@pytest.mark.parametrize("fail", [False, True])
def test_close_releases_memory_after_the_last_reference_goes(monkeypatch, fail):
    """Shutdown, then the memory release with the engine already unreachable and the
    captured rows dropped; a failing shutdown still releases, and its error propagates."""
    calls: list[str] = []
    llm = FakeLLM(calls, fail=fail)
    alive = weakref.ref(llm)
    lm = closing_model(llm)
    del llm

    def release():
        calls.append(f"release engine_alive={alive() is not None} rows={lm._sink.pop('row')}")

    monkeypatch.setattr(_model, "release_engine_memory", release)
    if fail:
        with pytest.raises(RuntimeError, match="shutdown failed"):
            lm._close_backend()
    else:
        lm._close_backend()
    assert calls == ["shutdown", "release engine_alive=False rows=None"]
    assert lm.llm is None
    lm._close_backend()  # a second close does nothing
    assert len(calls) == 2


def test_release_runs_every_step_in_order_even_when_one_fails(monkeypatch, caplog):
    """Model-parallel teardown, distributed teardown, gc, CUDA cache: each runs, a failure
    is logged and does not stop the rest."""
    from vllm.distributed import parallel_state

    calls: list[str] = []

    def step(name, fail=False):
        def run():
            calls.append(name)
            if fail:
                raise RuntimeError(f"{name} broke")

        return run

    monkeypatch.setattr(parallel_state, "destroy_model_parallel", step("mp", fail=True))
    monkeypatch.setattr(parallel_state, "destroy_distributed_environment", step("dist"))
    monkeypatch.setattr(gc, "collect", step("gc"))
    monkeypatch.setattr(_model, "_empty_cuda_cache", step("cuda"))
    _model.release_engine_memory()
    assert calls == ["mp", "dist", "gc", "cuda"]
    assert "destroy_model_parallel failed" in caplog.text


SCRIPT = textwrap.dedent(
    """
    import json, sys
    from vllm.distributed import parallel_state
    from genlm.backends.vllm import VLLMLM

    path, opts = sys.argv[1], json.loads(sys.argv[2])
    rows, states = [], []
    for _ in range(2):
        lm = VLLMLM.from_name(path, engine_opts=opts, cache_bytes=0)
        rows.append(lm.next_token_logprobs_sync([1, 2, 3]).tolist())
        lm.close()
        states.append(parallel_state.model_parallel_is_initialized())
    print(json.dumps({"same_rows": rows[0] == rows[1], "parallel_state_left": states}))
    """
)


def test_a_second_engine_starts_in_the_same_process_after_close(tiny_path):
    """In-process engine: close leaves no model-parallel state, and a new engine then
    starts and gives the same row."""
    report = _in_a_process(SCRIPT, tiny_path)
    assert report == {"same_rows": True, "parallel_state_left": [False, False]}


FREED = textwrap.dedent(
    """
    import gc, json, sys, weakref
    from genlm.backends.vllm import VLLMLM

    path, opts = sys.argv[1], json.loads(sys.argv[2])
    report = {}
    # The first model imports vLLM's engine, the second is dropped open: each a way a
    # model was kept (the import's frames, the heap vLLM froze).
    for how in ("closed", "dropped"):
        lm = VLLMLM.from_name(path, engine_opts=opts, cache_bytes=0)
        lm.next_token_logprobs_sync([1, 2, 3])
        model, engine, worker = weakref.ref(lm), weakref.ref(lm.llm), lm.worker
        if how == "closed":
            lm.close()
        gc.disable()  # reference counting alone: no batcher holds the model in a cycle
        del lm
        by_refcount = model() is None
        gc.enable()
        gc.collect()
        freed = model() is None
        report[how] = {
            "by_refcount": by_refcount,
            "model_freed": freed,
            "engine_freed": engine() is None,
            # the stop its finalizer queued, or close's; never, for a model kept alive
            "worker_stopped": freed and worker.stopped.result(timeout=60) is None,
        }
    try:
        lm = VLLMLM.from_name(path, engine_opts=opts, cache_bytes=0)
    except RuntimeError as exc:  # another model's engine is still open
        report["next_row"] = str(exc)
    else:
        report["next_row"] = len(lm.next_token_logprobs_sync([1, 2, 3])) == len(lm.vocab)
        lm.close()
    print(json.dumps(report))
    """
)


def test_a_closed_or_dropped_model_and_its_engine_are_freed(tiny_path):
    """In-process engine, vLLM imported by the first model: closed then dropped, the model
    is freed by reference counting alone (its generation batcher held it in a cycle) and
    vLLM's LLM by a collection; dropped open, the same, its worker stops,
    and a new model then starts in the process (it was refused while the dropped one
    lived)."""
    report = _in_a_process(FREED, tiny_path)
    freed = {
        "by_refcount": True,
        "model_freed": True,
        "engine_freed": True,
        "worker_stopped": True,
    }
    assert report == {"closed": freed, "dropped": freed, "next_row": True}


def _in_a_process(script: str, tiny_path) -> dict:
    """:func:`run_in_process` with an in-process engine of the tiny model (the tests'
    engine options, without LoRA)."""
    from .conftest import ENGINE_OPTS_NO_LORA, run_in_process

    return run_in_process(script, [str(tiny_path), json.dumps(ENGINE_OPTS_NO_LORA)])


CLOSE_WHILE_SAMPLING = textwrap.dedent(
    """
    import asyncio, json, sys, threading
    from genlm.backends.vllm import VLLMLM

    path, opts = sys.argv[1], json.loads(sys.argv[2])
    lm = VLLMLM.from_name(path, engine_opts=opts)
    engine = lm.llm.llm_engine
    step, started, proceed, steps = engine.step, threading.Event(), threading.Event(), []

    def gated_step():  # a slow engine step: the first one holds until close is under way
        steps.append(1)
        outputs = step()
        started.set()
        proceed.wait(timeout=60)
        return outputs

    engine.step = gated_step

    async def close_midway():
        sampling = asyncio.create_task(
            lm.sample([1, 2, 3], 100, eos_token_ids=[], temperature=1.0)
        )
        await asyncio.to_thread(started.wait, 60)
        closing = asyncio.create_task(lm.aclose())
        await asyncio.sleep(0)  # aclose has begun closing, and now waits
        proceed.set()
        await closing
        try:
            return f"{len(await sampling)} tokens"
        except Exception as exc:
            return type(exc).__name__

    outcome = asyncio.run(close_midway())
    lm.close()  # returns at once, closed; joins the worker thread, which aclose need not
    left = [t.name for t in threading.enumerate() if t.name == lm.worker.name]
    print(json.dumps({"steps": len(steps), "sample": outcome, "threads_left": left}))
    """
)


def test_close_stops_an_unseeded_generation_at_the_next_engine_step(tiny_path):
    """aclose() during vLLM's native generation (100 tokens, one per engine step) stops it
    after the step running when close began, aborting its requests: the sample raises
    ModelClosedError and the worker thread is gone. close() waited for the whole
    generation, and the sample returned all its tokens after the close."""
    report = _in_a_process(CLOSE_WHILE_SAMPLING, tiny_path)
    assert report == {"steps": 1, "sample": "ModelClosedError", "threads_left": []}


CLOSED_ADAPTERS = textwrap.dedent(
    """
    import json, sys
    from genlm.backends.vllm import VLLMLM

    path, opts, adapter = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    lm = VLLMLM.from_name(path, engine_opts=opts, cache_bytes=0)
    lm.add_lora(adapter, "a")
    lm.set_lora("a")
    lm.close()
    report = {"loaded": list(lm.loaded_loras), "active": lm.active_lora}
    calls = {
        "set_lora": lambda: lm.set_lora("a"),
        "clear_lora": lm.clear_lora,
        "remove_lora": lambda: lm.remove_lora("a"),
        "add_lora": lambda: lm.add_lora(adapter, "b"),
    }
    for name, call in calls.items():
        try:
            call()
            report[name] = "returned"
        except Exception as exc:
            report[name] = type(exc).__name__
    print(json.dumps(report))
    """
)


def test_a_closed_model_lists_no_adapter_and_its_adapter_calls_raise(tiny_path, adapter):
    """After close no adapter is listed or active (the closed model still listed its
    adapters, set_lora and clear_lora still returned), and the adapter calls raise
    ModelClosedError."""
    from .conftest import ENGINE_OPTS, run_in_process

    report = run_in_process(
        CLOSED_ADAPTERS, [str(tiny_path), json.dumps(ENGINE_OPTS), str(adapter[0])]
    )
    closed = "ModelClosedError"
    assert report == {
        "loaded": [],
        "active": None,
        "set_lora": closed,
        "clear_lora": closed,
        "remove_lora": closed,
        "add_lora": closed,
    }
