"""Print, as JSON, what genlm-backend's API and genlm-control show of a model whose logit rows
are wider than its tokenizer.

The model is stories260K (512 tokens) with its output padded to 600 logits, the padding rows
given weight, as Qwen2 and Phi-3 checkpoints are padded. Whichever ``genlm.backend`` comes
first on ``sys.path`` answers: GenLM's, or the reference's (``PYTHONPATH``);
``test_reference_parity.py`` runs this once per side and compares.

Output keys: ``backend_module``; ``byte_vocab`` (hex of each entry) and ``token_ids`` of
``AsyncTransformer.byte_vocab``, ``str_vocab``, ``decode_vocab`` (the length of
``decode_vocab(tokenizer)``'s lists); ``rows``: each context's row (``-inf`` as ``null``);
``control``: genlm-control's ``PromptedLLM`` vocabulary (hex) and ``logw_next`` rows. (The
reference's genlm-bytes 0.2.0 cannot run such a model: its trie asserts that rows are as wide
as the tokenizer; genlm-bytes' own tests cover GenLM's.)
"""

from __future__ import annotations

import asyncio
import json
import math

CONTEXTS = [[1, 403, 407], [1, 403, 407, 261], [1, 20]]


def values(row) -> list[float | None]:
    """A row as JSON numbers, ``-inf`` as None."""
    return [None if v == -math.inf else float(v) for v in row]


async def observe() -> dict:
    """What the API and genlm-control show of the padded model (see the module docstring)."""
    import torch
    import transformers

    from genlm.backend.llm import AsyncTransformer
    from genlm.backend.tokenization import decode_vocab
    from genlm.control import PromptedLLM
    from genlm.core.backend import resolve_model_path

    path = resolve_model_path("stories260K")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path).double().eval()
    torch.manual_seed(0)
    model.resize_token_embeddings(600)
    with torch.no_grad():
        model.get_output_embeddings().weight[512:] = 0.5
    llm = AsyncTransformer(model, tokenizer)
    out = {
        "byte_vocab": [bytes(t).hex() for t in llm.byte_vocab],
        "token_ids": [t.token_id for t in llm.byte_vocab],
        "str_vocab": llm.str_vocab,
        "decode_vocab": [len(v) for v in decode_vocab(tokenizer)],
        "rows": [values(await llm.next_token_logprobs(c)) for c in CONTEXTS],
    }
    eos = llm.byte_vocab[tokenizer.eos_token_id].byte_string
    prompted = PromptedLLM(llm, eos_byte_strings=[eos])
    prompted.prompt_ids = CONTEXTS[0][:2]
    out["control"] = {
        "vocab": [bytes(t).hex() for t in prompted.vocab],
        "logw": [
            values((await prompted.logw_next(prompted.decode_tokens(c[2:]))).weights)
            for c in CONTEXTS[:2]
        ],
    }
    return out


def main() -> None:
    """Write the observations and the module that made them to stdout."""
    import genlm.backend

    result = {"backend_module": genlm.backend.__file__, **asyncio.run(observe())}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
