"""MockLM: its batch record stays bounded over a long run (issue #21); its loader's tokenizer."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from genlm.core.mock import MockLM

VOCAB = [b"a", b"b", b"c", b"d", b"e"]


def test_batches_keeps_the_latest_and_the_counters_count_everything():
    """With keep_batches=2, batches holds the last two batches; the counters hold all five."""
    lm = MockLM(VOCAB, keep_batches=2)
    contexts = [[[i, 0], [i, 1]] for i in range(5)]
    for batch in contexts:
        lm.batch_next_token_logprobs_sync(batch)
    lm.close()
    assert lm.batches == [[tuple(c) for c in batch] for batch in contexts[-2:]]
    assert lm.batch_count == 5 and lm.context_count == 10


def test_the_default_record_is_bounded():
    """A run of more batches than KEEP_BATCHES keeps only the latest KEEP_BATCHES."""
    lm = MockLM([bytes([b]) for b in range(256)])
    n = MockLM.KEEP_BATCHES + 5
    contexts = [(i // 256, i % 256) for i in range(n)]  # all distinct: no cache hit
    for context in contexts:
        lm.next_token_logprobs_sync(context)
    lm.close()
    assert lm.batch_count == n
    assert lm.batches == [[c] for c in contexts[-MockLM.KEEP_BATCHES :]]


def test_keep_batches_zero_records_none():
    """keep_batches=0 records nothing but still counts; a negative bound is refused."""
    lm = MockLM(VOCAB, keep_batches=0)
    lm.next_token_logprobs_sync([0])
    lm.close()
    assert lm.batches == [] and lm.batch_count == 1
    with pytest.raises(ValueError, match="keep_batches"):
        MockLM(VOCAB, keep_batches=-1)


@pytest.mark.parametrize(
    "option, error, message",
    [
        ({"keep_batches": 2.5}, TypeError, "keep_batches must be an integer"),
        ({"keep_batches": float("nan")}, TypeError, "keep_batches must be an integer"),
        ({"keep_batches": None}, TypeError, "keep_batches must be an integer"),
        ({"keep_batches": "3"}, TypeError, "keep_batches must be an integer"),
        ({"latency_s": "4"}, TypeError, "latency_s must be a number of seconds"),
        ({"latency_s": None}, TypeError, "latency_s must be a number of seconds"),
        ({"latency_s": float("nan")}, ValueError, "latency_s must be finite and >= 0"),
        ({"latency_s": 1e30}, ValueError, "latency_s must be at most 1e\\+09"),
    ],
)
def test_bad_options_are_refused_by_name(option, error, message):
    """The mock's own options are checked as BatchedLM's are: a NaN keep_batches never
    bounded `batches`, a latency of 1e30 failed every batch (time.sleep overflows), and a
    string or None gave a bare comparison TypeError."""
    with pytest.raises(error, match=message):
        MockLM(VOCAB, **option)


def test_a_whole_keep_batches_of_numpy_type_is_an_int():
    """A numpy integer is an integer option; the mock keeps it as a Python int."""
    lm = MockLM(VOCAB, keep_batches=np.int64(1), latency_s=np.float32(0))
    lm.close()
    assert type(lm.keep_batches) is int and type(lm.latency_s) is float


@pytest.mark.parametrize(
    "vocab, entry",
    [
        ([1, 2, 3], "vocab[0] is int 1"),  # bytes(1) would be one NUL byte
        (b"abc", "vocab[0] is int 97"),  # a bytes object iterates as ints
        (["a", "b"], "vocab[0] is str 'a'"),
        ([b"a", None], "vocab[1] is None"),
    ],
)
def test_a_vocabulary_entry_that_is_not_bytes_is_refused_by_name(vocab, entry):
    """Entries are not converted with bytes(): one that is not bytes is a TypeError naming it,
    as Vocabulary and TokenByteTrie raise, instead of a token of NUL bytes."""
    with pytest.raises(TypeError, match=re.escape(entry) + ".*not bytes"):
        MockLM(vocab)


def test_bytes_subclass_entries_are_their_bytes():
    """A bytes subclass (genlm-backend's Token) is taken as its plain bytes."""

    class Token(bytes):
        pass

    lm = MockLM([Token(b"ab"), b"c"])
    lm.close()
    assert lm.vocab.tokens == (b"ab", b"c") and all(type(t) is bytes for t in lm.vocab.tokens)


def test_from_name_carries_the_tokenizer_json_tokenizer():
    """The mock backend's loader attaches the file's tokenizer: it adds BOS and its ids spell
    the text in the vocabulary read independently from the same file."""
    pytest.importorskip("tokenizers")
    lm = MockLM.from_name("stories260K")
    text = "Once upon a time, Lily saw 3 cats.\n\nThe end é"
    ids = lm.tokenizer.encode(text, add_special_tokens=False)
    # A sentencepiece tokenizer (this Llama's) spells a leading space (its dummy prefix).
    assert lm.vocab.decode(ids) in (text.encode(), b" " + text.encode())
    assert lm.tokenizer.encode(text) == [lm.vocab.bos_token_id, *ids]
    assert lm.tokenizer.decode(ids) == text
    assert MockLM.from_name("stories260K", tokenizer=None).tokenizer is None
    lm.close()


def test_genlm_smc_runs_on_the_mock_backend(capsys):
    """`genlm smc --backend mock` encodes its prompt with that tokenizer and prints particles
    decoded from the mock's vocabulary (the README's backends table: any tokenizer
    directory)."""
    pytest.importorskip("tokenizers")
    from genlm.core.cli import main

    argv = ["smc", "Once upon", "--backend", "mock", "--particles", "3", "--max-tokens", "4"]
    assert main([*argv, "--seed", "0", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("Once upon") == 3, out


def test_from_name_without_tokenizers_installed_logs_why(monkeypatch, caplog):
    """Without the tokenizers package the loaded mock has no tokenizer and the log (INFO,
    what `genlm -v` shows) names the package and its install."""
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails, find_spec is None
    with caplog.at_level("INFO", logger="genlm.core.mock"):
        lm = MockLM.from_name("stories260K")
    assert lm.tokenizer is None
    assert "no tokenizer" in caplog.text and "pip install tokenizers" in caplog.text
    lm.close()


def test_genlm_smc_on_the_mock_without_tokenizers_says_to_install_it(monkeypatch, capsys):
    """`genlm smc --backend mock` without tokenizers fails with one line that says why the
    mock has no tokenizer and what to pip install."""
    from genlm.core.cli import main

    monkeypatch.setitem(sys.modules, "tokenizers", None)
    argv = ["smc", "Once upon", "--backend", "mock", "--particles", "2", "--max-tokens", "2"]
    assert main([*argv, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "cannot encode a text prompt" in err and "(pip install tokenizers)" in err, err


def test_from_name_without_a_tokenizer_the_installed_tokenizers_can_read(tmp_path, caplog):
    """A tokenizer.json the vocabulary reader takes but the installed tokenizers cannot (a
    newer format: here an unknown decoder) still loads, without a tokenizer and with a
    warning; a directory without one names the missing file (tokenizers' own error named
    no path)."""
    import json

    from genlm.core._embedded import resolve_model_path

    pytest.importorskip("tokenizers")
    spec = json.loads((Path(resolve_model_path("stories260K")) / "tokenizer.json").read_text())
    spec["decoder"] = {"type": "SomeNewerDecoder"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with caplog.at_level("WARNING", logger="genlm.core.mock"):
        lm = MockLM.from_name(str(tmp_path))
    assert lm.tokenizer is None and len(lm.vocab) == len(spec["model"]["vocab"])
    assert "no tokenizer" in caplog.text
    lm.close()
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        MockLM.from_name(str(tmp_path))
