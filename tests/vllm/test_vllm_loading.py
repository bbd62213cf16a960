"""The tokenizer and configuration are read with the engine's own loading options
(``engine_opts``' ``trust_remote_code`` and revisions), so a model vLLM loads loads here."""

from __future__ import annotations

import json
import shutil
import textwrap

import numpy as np

#: Starts the backend over a model directory in a fresh process (one in-process engine per
#: process) and prints a row.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from genlm.backends.vllm import VLLMLM
    lm = VLLMLM(sys.argv[1], engine_opts=json.loads(sys.argv[2]))
    print(json.dumps(lm.next_token_logprobs_sync([1, 2, 3]).tolist()))
    lm.close()
    """
)


def test_a_model_with_its_own_configuration_code_loads_with_trust_remote_code(
    tiny_path, tmp_path, expected
):
    """A model whose configuration class is code in its directory (``auto_map``) loads with
    ``engine_opts={"trust_remote_code": True}``, as ``vllm.LLM`` takes it, and gives the
    weights' rows (the backend read its configuration without the option: transformers
    refused, or asked at the terminal)."""
    from .conftest import ENGINE_OPTS_NO_LORA, run_in_process

    model = tmp_path / "custom"
    shutil.copytree(tiny_path, model)
    config = json.loads((model / "config.json").read_text())
    config.update(model_type="customllama", auto_map={"AutoConfig": "configuration.Custom"})
    (model / "config.json").write_text(json.dumps(config))
    (model / "configuration.py").write_text(
        "from transformers import LlamaConfig\n\n\n"
        "class Custom(LlamaConfig):\n    model_type = 'customllama'\n"
    )
    opts = {**ENGINE_OPTS_NO_LORA, "trust_remote_code": True}
    row = np.array(run_in_process(SCRIPT, [str(model), json.dumps(opts)]))
    np.testing.assert_allclose(row, expected([1, 2, 3]), atol=1e-4)


#: Starts the backend in a fresh process and prints its EOS ids and a greedy sample.
EOS_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from genlm.backends.vllm import VLLMLM
    lm = VLLMLM(sys.argv[1], engine_opts=json.loads(sys.argv[2]))
    tokens = asyncio.run(lm.sample([1, 2, 3], max_tokens=5, temperature=0))
    print(json.dumps([list(lm.vocab.eos_token_ids), tokens]))
    lm.close()
    """
)


def test_sampling_ends_at_the_models_own_eos_ids(tiny_path, tmp_path, expected):
    """The EOS ids of the model's generation configuration (what vLLM's generation stops
    on) join the tokenizer's: greedy sampling ends at the token the model picks first once
    ``generation_config.json`` names it, where it ran on to ``max_tokens``."""
    from .conftest import ENGINE_OPTS_NO_LORA, run_in_process

    first = int(np.argmax(expected([1, 2, 3])))
    model = tmp_path / "eos"
    shutil.copytree(tiny_path, model)
    generation = json.loads((model / "generation_config.json").read_text())
    eos = generation["eos_token_id"]
    assert first != eos
    generation["eos_token_id"] = [eos, first]
    (model / "generation_config.json").write_text(json.dumps(generation))
    ids, tokens = run_in_process(EOS_SCRIPT, [str(model), json.dumps(ENGINE_OPTS_NO_LORA)])
    assert ids == [eos, first] and tokens == [first]
