"""The genlm-backend 0.3 README's example runs on GenLM, verbatim but for the model name.

``EXAMPLE`` is the "Autobatched Sequential Importance Sampling" example of genlm-backend
0.3's README (issue 13 asks for it to run unchanged); only ``"gpt2"`` is replaced, by the
embedded stories260K, so the test runs offline. Top-level ``await`` is compiled as in a
notebook, where the README runs it.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io

import torch

EXAMPLE = """
import torch
import asyncio
from genlm.backend import load_model_by_name

# --- Token-level masking using the byte-level vocabulary --- #
def make_masking_function(llm, max_token_length, max_tokens):
    eos_id = llm.tokenizer.eos_token_id
    valid_ids = torch.tensor([
        token_id == eos_id or len(token) <= max_token_length
        for token_id, token in enumerate(llm.byte_vocab)
    ], dtype=torch.float).log()
    eos_one_hot = torch.nn.functional.one_hot(
        torch.tensor(eos_id), len(llm.byte_vocab)
    ).log()

    def masking_function(context):
        return eos_one_hot if len(context) >= max_tokens else valid_ids

    return masking_function

# --- Particle class for SIS --- #
class Particle:
    def __init__(self, llm, mask_function, prompt_ids):
        self.context = []
        self.prompt_ids = prompt_ids
        self.log_weight = 0.0
        self.active = True
        self.llm = llm
        self.mask_function = mask_function

    async def extend(self):
        logps = await self.llm.next_token_logprobs(self.prompt_ids + self.context)
        masked_logps = logps + self.mask_function(self.context).to(logps.device)
        logZ = masked_logps.logsumexp(dim=-1)
        self.log_weight += logZ
        next_token_id = torch.multinomial((masked_logps - logZ).exp(), 1).item()
        if next_token_id == self.llm.tokenizer.eos_token_id:
            self.active = False
        else:
            self.context.append(next_token_id)

# --- Autobatched SIS loop --- #
async def autobatched_sis(n_particles, llm, masking_function, prompt_ids):
    particles = [Particle(llm, masking_function, prompt_ids) for _ in range(n_particles)]
    while any(p.active for p in particles):
        await asyncio.gather(*[p.extend() for p in particles if p.active])
    return particles

# --- Run the example --- #
llm = load_model_by_name("gpt2") # or e.g., "meta-llama/Llama-3.2-1B" if you have access
mask_function = make_masking_function(llm, max_token_length=10, max_tokens=10)
prompt_ids = llm.tokenizer.encode("Montreal is")
particles = await autobatched_sis( # use asyncio.run(autobatched_sis(...)) if you are not in an async context
    n_particles=10, llm=llm, masking_function=mask_function, prompt_ids=prompt_ids
)

strings = [llm.tokenizer.decode(p.context) for p in particles]
log_weights = torch.tensor([p.log_weight for p in particles])
probs = torch.exp(log_weights - log_weights.logsumexp(dim=-1))

for s, p in sorted(zip(strings, probs), key=lambda x: -x[1]):
    print(f"{repr(s)} (probability: {p:.4f})")
"""  # noqa: E501 (verbatim)

MODEL = "stories260K"


def run_example() -> dict:
    source = EXAMPLE.replace('load_model_by_name("gpt2")', f"load_model_by_name({MODEL!r})")
    assert source != EXAMPLE  # the one edit was made
    namespace: dict = {}
    code = compile(source, "readme_example", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        asyncio.run(eval(code, namespace))
    namespace["printed"] = out.getvalue()
    return namespace


def test_readme_example_runs_and_weights_are_the_masked_normalizers():
    ns = run_example()
    llm, particles = ns["llm"], ns["particles"]
    eos = llm.tokenizer.eos_token_id
    assert len(particles) == 10 and not any(p.active for p in particles)
    assert len(ns["printed"].splitlines()) == 10
    torch.testing.assert_close(ns["probs"].sum(), torch.tensor(1.0, dtype=ns["probs"].dtype))
    for p in particles:
        assert len(p.context) <= 10
        assert all(len(llm.byte_vocab[t]) <= 10 and t != eos for t in p.context)
        # Independent expectation: the weight is the sum of each step's masked normalizer,
        # recomputed here in float64 from fresh rows (the last step allows only EOS).
        expected = 0.0
        for t in range(len(p.context) + 1):
            context = p.prompt_ids + p.context[:t]
            logps = llm.next_token_logprobs_uncached(context).double()
            if t >= 10:
                allowed = [eos]
            else:
                allowed = [i for i, tok in enumerate(llm.byte_vocab) if i == eos or len(tok) <= 10]
            expected += torch.logsumexp(logps[allowed], dim=0).item()
        assert abs(float(p.log_weight) - expected) < 1e-3
    llm.close()
