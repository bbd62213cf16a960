"""How engine outputs reach their runs when a generation has made way for a row batch, on a
scripted engine (no vLLM model): each output goes to the run that added its request, and a
request the engine dropped fails its own run, not the one stepping it."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from genlm.backends.vllm import _model
from genlm.backends.vllm._sessions import SessionTable


class ScriptedEngine:
    """Stands for vLLM's ``LLMEngine``: each step returns the next scripted outputs; the
    engine has work while any script is left."""

    def __init__(self, script: list[list[SimpleNamespace]]):
        self.script, self.aborted = list(script), []

    def add_request(self, key, prompt, params, lora_request=None):
        pass

    def step(self):
        return self.script.pop(0) if self.script else []

    def has_unfinished_requests(self) -> bool:
        return bool(self.script)

    def abort_request(self, keys):
        self.aborted.extend(keys)


def output(key: str, tokens: list[int]) -> SimpleNamespace:
    return SimpleNamespace(
        request_id=key, finished=True, outputs=[SimpleNamespace(token_ids=tokens)]
    )


def model(engine: ScriptedEngine) -> _model.VLLMLM:
    lm = object.__new__(_model.VLLMLM)  # only the state the runs touch
    lm.llm = SimpleNamespace(llm_engine=engine)
    lm._live, lm._answered, lm._sessions = {}, {}, SessionTable(0)
    lm.worker = SimpleNamespace(closed=False, has_waiting_calls=lambda: False)
    lm.name = "scripted"
    return lm


def generation(key: str) -> tuple[list[_model._Generation], dict[str, _model._EngineRequest]]:
    """A generation of one request that has made way (added, not yet answered)."""
    request = _model._EngineRequest(key, [1], None, None, threading.Event())
    return [_model._Generation(None, [request])], {key: request}


def test_outputs_reach_the_run_that_added_their_request():
    """A row batch steps the engine: its row comes back to it, the generation's tokens are
    kept for the generation, which reads them when it resumes, without a step."""
    engine = ScriptedEngine([[output("gen", [7, 8]), output("row", [3])]])
    lm = model(engine)
    calls, pending = generation("gen")
    lm._live.update(pending)
    row = _model._EngineRequest("row", [5], None, None)
    assert lm._run([row]).keys() == {"row"}
    assert lm._answered.keys() == {"gen"} and not lm._live
    assert lm._generation_steps(calls, pending, {}, True) == [[[7, 8]]]
    assert not lm._answered and not engine.aborted


def test_a_request_the_engine_dropped_fails_its_own_run():
    """The engine runs out of work with the generation's request unanswered while a row
    batch steps it: the batch ends normally, and the generation raises when it resumes."""
    engine = ScriptedEngine([[output("row", [3])]])
    lm = model(engine)
    calls, pending = generation("gen")
    lm._live.update(pending)
    row = _model._EngineRequest("row", [5], None, None)
    assert lm._run([row]).keys() == {"row"}
    with pytest.raises(RuntimeError, match="finished without answering request gen"):
        lm._generation_steps(calls, pending, {}, True)
    assert not lm._live and not lm._answered
