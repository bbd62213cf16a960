"""genlm-core's wheel: console script, embedded model, mock backend, trie kernel.

Usage: ``python smoke_core.py {c,numpy}``, the trie kernel this install must run (numpy
for a wheel built without a C compiler).
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from _smoke import assert_installed, run_genlm, start


def main(kernel: str) -> None:
    start("genlm-core")
    import genlm.core
    from genlm.core import TokenByteTrie, load_model_by_name

    assert_installed(genlm.core)
    report = json.loads(run_genlm("backends", "--json"))
    assert "mock" in {row["name"] for row in report["backends"]}, report
    lm = load_model_by_name("stories260K", backend="mock")  # the embedded model's vocabulary
    row = asyncio.run(lm.next_token_logprobs([1, 403]))
    assert row.shape == (512,) and abs(np.logaddexp.reduce(row.astype(np.float64))) < 1e-5
    lm.close()

    tokens = list(lm.vocab.tokens)
    trie = TokenByteTrie(tokens)
    assert trie.kernel == kernel, f"expected the {kernel} kernel, got {trie.kernel}"
    from genlm.core import _validation  # built with the trie's kernel, or not at all

    assert (_validation._first_doubt is not None) == (kernel == "c"), _validation._first_doubt
    weights = np.random.default_rng(0).random(len(tokens))
    masses = trie.weight_sum(weights)
    for node in range(trie.num_nodes):  # brute force: every node's mass from the tokens
        prefix = trie.prefix(node)
        expected = sum(w for t, w in zip(tokens, weights) if t and t.startswith(prefix))
        assert np.isclose(masses[node], expected, rtol=1e-12), prefix


if __name__ == "__main__":
    main(sys.argv[1])
