"""Print, as JSON, a single ``LazyTrieState`` walking a text: where its partial token is a
whole token, and the state after ending each token there.

Whichever ``genlm.backend`` and ``genlm.bytes`` come first on ``sys.path`` answer: GenLM's, or
the reference's (genlm-backend 0.3.1 and genlm-bytes 0.2.0, put first with ``PYTHONPATH``);
``test_reference_parity.py`` runs this once per side and compares. The released 0.2.0 names
the documented ``get_EOT``/``extend`` ``get_all_EOT``/``extend_all`` (one entry per token id
spelling the partial); GenLM has the documented pair and ``extend_all``, so both sides are
asked for ``extend_all``, and GenLM also for its pair.

The model is stories260K in float64 through ``AsyncTransformer``. The walk is greedy: a
partial token grows while the next byte continues it, else the token ends there
(``extend``) and the byte starts the next.

Output: ``{"bytes_module": path, "steps": [...]}``, one step per byte with the partial's hex,
the state's weight and whether the partial is a whole token, and at each token end the ids
and weights of the ``extend_all`` states (GenLM also ``get_EOT()`` as ``eot``), the new
weight (their total; GenLM: ``extend()``'s) and the new state's ``logp_next.ps`` (``-inf`` as
``null``). Each side goes on after the heaviest id.
"""

from __future__ import annotations

import asyncio
import json
import math

TEXT = b" Once upon a time, there was a little girl."


def values(ps) -> list[float | None]:
    """A row as JSON numbers, ``-inf`` as None."""
    return [None if v == -math.inf else float(v) for v in ps]


def ended(state) -> tuple[dict, object]:
    """What ending the partial token gives (``extend_all``'s ids and weights, their total,
    and GenLM's ``get_EOT()`` and ``extend()`` weight), and the state after the heaviest id."""
    states = sorted(state.extend_all(), key=lambda s: s.lm_state.context[-1])
    found = {
        "ids": [s.lm_state.context[-1] for s in states],
        "weights": [float(s.weight) for s in states],
        "ended": math.log(sum(math.exp(s.weight) for s in states)),
    }
    heaviest = max(states, key=lambda s: s.weight)
    if hasattr(state, "get_EOT"):  # GenLM: the documented pair too
        after = state.extend()
        found.update(eot=state.get_EOT(), extended=float(after.weight))
        assert after.lm_state.context == heaviest.lm_state.context
    return found, heaviest


def whole(state) -> bool:
    """Whether the partial token is a whole token, by each side's names."""
    if hasattr(state, "get_all_EOT"):
        return bool(state.get_all_EOT())
    return state.get_EOT() is not None


async def walk() -> list[dict]:
    """The steps of the greedy walk over :data:`TEXT` (see the module docstring)."""
    import torch
    import transformers

    from genlm.backend.llm import AsyncTransformer
    from genlm.bytes.byte_lm.trie_state import LazyTrieState
    from genlm.bytes.trie import AsyncTokenByteTrie, TrieMode
    from genlm.core.backend import resolve_model_path

    path = resolve_model_path("stories260K")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    llm = AsyncTransformer(model, tokenizer)
    eos = llm.byte_vocab[tokenizer.eos_token_id].byte_string
    trie = AsyncTokenByteTrie.from_vocab(llm.byte_vocab, eos_byte_strings=[eos])
    state = await LazyTrieState.initial(llm, trie, TrieMode.WITH_EOS).materialize()
    steps = []
    for b in TEXT:
        step = {"partial": bytes(state.partial).hex(), "weight": float(state.weight)}
        step["whole"] = whole(state)
        if state << b is None:
            found, state = ended(state)
            state = await state.materialize()
            step.update(found, ps=values(state.logp_next.ps))
        state = state << b
        steps.append(step)
    await state.cleanup()
    return steps


def main() -> None:
    """Write the steps and the module that computed them to stdout."""
    import genlm.bytes

    result = {"bytes_module": genlm.bytes.__file__, "steps": asyncio.run(walk())}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
