"""GenLM's byte model equals the reference's where genlm-control's ``test_bytelm_smc`` walks.

``GENLM_REFERENCE_PATH`` names a folder holding the reference (genlm-backend 0.3.1 and
genlm-bytes 0.2.0, installed there with ``pip install --target``); ``nox -s clients`` sets it.
``bytellm_path.py`` runs twice, once on GenLM and once with that folder first on the path, and
every ``ByteLLM.logw_next`` row must agree: the same symbols, ``-inf`` at the same places, and
finite values within float32 round-off of the model's logits.

Why this test: that client test fails on the random-weight stand-in for GPT-2 (see
genlm-backend/README.md). Equal rows show the failure is the stand-in model's, not GenLM's.

``padded_vocab.py`` runs the same way: a model whose logit rows are wider than its tokenizer
must show genlm-backend's API and genlm-control's ``PromptedLLM`` what the reference shows.
So does ``trie_state_path.py``: a single ``LazyTrieState`` ending tokens (``get_EOT``,
``extend``) as the reference's does.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REFERENCE = os.environ.get("GENLM_REFERENCE_PATH")
SCRIPT = Path(__file__).with_name("bytellm_path.py")
PADDED_SCRIPT = Path(__file__).with_name("padded_vocab.py")
TRIE_STATE_SCRIPT = Path(__file__).with_name("trie_state_path.py")
#: Both sides run the same float32 model; their byte masses are float64 sums of its rows.
ATOL = 1e-4

pytestmark = pytest.mark.skipif(
    not REFERENCE, reason="GENLM_REFERENCE_PATH (the reference's --target folder) is not set"
)


def run(reference: str | None, script: Path = SCRIPT) -> dict:
    """``script``'s JSON, with ``reference`` alone on ``PYTHONPATH`` when given (GenLM's side
    keeps the caller's ``PYTHONPATH``: the installed distributions, or a checkout's sources)."""
    env = dict(os.environ)
    if reference:
        env["PYTHONPATH"] = reference
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_bytellm_rows_equal_the_reference():
    """Every row along the path: same support, same values to ``ATOL``."""
    ref_root = Path(REFERENCE).resolve()
    ours, ref = run(None), run(str(ref_root))
    # Each side really ran the implementation it names.
    assert not Path(ours["bytes_module"]).resolve().is_relative_to(ref_root)
    assert Path(ref["bytes_module"]).resolve().is_relative_to(ref_root)
    assert len(ours["rows"]) == len(ref["rows"]) > 1
    for mine, theirs in zip(ours["rows"], ref["rows"], strict=True):
        assert mine["prefix"] == theirs["prefix"]
        a = dict(zip(mine["symbols"], mine["logw"], strict=True))
        b = dict(zip(theirs["symbols"], theirs["logw"], strict=True))
        where = f"after prefix {bytes.fromhex(mine['prefix'])!r}"
        assert a.keys() == b.keys(), where
        assert {s for s, v in a.items() if v is None} == {s for s, v in b.items() if v is None}
        worst = max(abs(a[s] - b[s]) for s in a if a[s] is not None)
        assert worst <= ATOL, f"{where}: largest difference {worst:.3g}"
        assert math.isfinite(a["EOS"]), where  # EOS is never lost: the client test needs it


def test_a_model_padded_beyond_its_tokenizer_looks_as_on_the_reference():
    """A model with 600 logits for 512 tokens: ``byte_vocab``/``str_vocab`` list the
    tokenizer's 512 tokens, rows are 600 wide and normalized over all of them, and
    genlm-control's ``PromptedLLM`` has the same vocabulary and ``logw_next`` rows (it drops
    the padding and renormalizes), as with genlm-backend 0.3.1."""
    ref_root = Path(REFERENCE).resolve()
    ours, ref = run(None, PADDED_SCRIPT), run(str(ref_root), PADDED_SCRIPT)
    assert not Path(ours["backend_module"]).resolve().is_relative_to(ref_root)
    assert Path(ref["backend_module"]).resolve().is_relative_to(ref_root)
    for key in ("byte_vocab", "token_ids", "str_vocab", "decode_vocab"):
        assert ours[key] == ref[key], key
    assert len(ours["byte_vocab"]) == 512 and ours["control"]["vocab"] == ref["control"]["vocab"]
    pairs = [*zip(ours["rows"], ref["rows"]), *zip(ours["control"]["logw"], ref["control"]["logw"])]
    for mine, theirs in pairs:
        assert len(mine) == len(theirs) and [v is None for v in mine] == [v is None for v in theirs]
        assert max(abs(a - b) for a, b in zip(mine, theirs) if a is not None) <= ATOL
    assert {len(row) for row in ours["rows"]} == {600}


def test_a_single_state_ends_tokens_as_on_the_reference():
    """Along a greedy walk, ``get_EOT()`` is None where the reference finds no token end;
    ``extend_all()`` gives the reference's states (the ids spelling the partial, two on
    this path, and their weights), ``get_EOT()`` the lowest of them, ``extend()`` the
    weight of them all, and the same next-symbol row once materialized (both go on after
    the heaviest id). Byte
    ``<`` is left out of the rows: 0.2.0 spells the special tokens' text (``<s>``), which
    is atomic here."""
    ref_root = Path(REFERENCE).resolve()
    ours, ref = run(None, TRIE_STATE_SCRIPT), run(str(ref_root), TRIE_STATE_SCRIPT)
    assert not Path(ours["bytes_module"]).resolve().is_relative_to(ref_root)
    assert Path(ref["bytes_module"]).resolve().is_relative_to(ref_root)
    duplicates = 0
    for mine, theirs in zip(ours["steps"], ref["steps"], strict=True):
        where = f"at partial {bytes.fromhex(mine['partial'])!r}"
        assert (mine["partial"], mine["whole"]) == (theirs["partial"], theirs["whole"]), where
        assert abs(mine["weight"] - theirs["weight"]) <= ATOL, where
        assert ("ids" in mine) == ("ids" in theirs), where
        if "ids" not in mine:
            continue
        assert mine["ids"] == theirs["ids"] and mine["eot"] == min(theirs["ids"]), where
        duplicates += len(theirs["ids"]) > 1
        for a, b in zip(mine["weights"], theirs["weights"], strict=True):
            assert abs(a - b) <= ATOL, where
        assert abs(mine["ended"] - theirs["ended"]) <= ATOL, where
        assert abs(mine["extended"] - theirs["ended"]) <= ATOL, where
        rows = [(a, b) for i, (a, b) in enumerate(zip(mine["ps"], theirs["ps"])) if i != ord("<")]
        assert [a is None for a, _ in rows] == [b is None for _, b in rows], where
        assert max(abs(a - b) for a, b in rows if a is not None) <= ATOL, where
    assert duplicates
