"""Print, as JSON, genlm-control's ``ByteLLM.logw_next`` along the path of its ``test_bytelm_smc``.

Whichever ``genlm.backend`` and ``genlm.bytes`` come first on ``sys.path`` answer: GenLM's, or
the reference's (genlm-backend 0.3.1 and genlm-bytes 0.2.0, put first with ``PYTHONPATH``).
``test_reference_parity.py`` runs this once per side and compares. The model is the Hub
cache's ``openai-community/gpt2`` (``hub_cache.py``), as in genlm-control's own test.

Output: ``{"bytes_module": path, "rows": [{"prefix": hex, "symbols": [...], "logw": [...]}]}``
where a symbol is a byte's hex or ``"EOS"`` and ``-inf`` is written as ``null``.
"""

from __future__ import annotations

import asyncio
import json
import math

#: genlm-control 0.4.1's tests/potential/test_bytellm.py::test_bytelm_smc: its prompt, and one
#: string its regex accepts (the path its SMC particles walk before they need EOS).
PROMPT = "Here is my honest opinion:"
ACCEPTED = " SMC is 😍😍 with LMs".encode()


async def rows() -> list[dict]:
    """``logw_next`` after every prefix of ``ACCEPTED`` (the empty one and the whole included)."""
    from genlm.backend import load_model_by_name
    from genlm.bytes import BeamParams
    from genlm.control import ByteLLM

    llm = load_model_by_name("openai-community/gpt2", backend="hf")
    eos = llm.byte_vocab[llm.tokenizer.eos_token_id].byte_string
    byte_llm = ByteLLM(llm, BeamParams(K=5, prune_threshold=0.0, eos_byte_strings=[eos]))
    byte_llm.set_prompt_from_str(PROMPT)
    out = []
    for n in range(len(ACCEPTED) + 1):
        prefix = ACCEPTED[:n]
        weights = (await byte_llm.logw_next([bytes([b]) for b in prefix])).materialize()
        symbols, logw = [], []
        for symbol, value in weights.items():
            symbols.append(symbol.hex() if isinstance(symbol, bytes) else "EOS")
            logw.append(None if value == -math.inf else float(value))
        out.append({"prefix": prefix.hex(), "symbols": symbols, "logw": logw})
    return out


def main() -> None:
    """Write the rows and the module that computed them to stdout."""
    import genlm.bytes

    result = {"bytes_module": genlm.bytes.__file__, "rows": asyncio.run(rows())}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
