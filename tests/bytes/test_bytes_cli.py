"""``genlm bytes`` through the core CLI, in-process, on the mock backend."""

from __future__ import annotations

import asyncio
import math
import os
import re

import pytest

from genlm.bytes import ByteLM
from genlm.core.cli import main
from genlm.core.mock import MockLM


@pytest.fixture
def no_tokenizer(monkeypatch):
    """The mock backend loads without its tokenizer: the prompt's bytes are prefilled from
    BOS, as for a model without one."""
    load = MockLM.from_name
    monkeypatch.setattr(
        MockLM, "from_name", lambda name, **options: load(name, tokenizer=None, **options)
    )


def test_cli_shows_the_next_byte_distribution_and_samples(capsys):
    """The plugin command prints top bytes with probabilities and a seeded sample; the
    prompt is the tokenizer's tokens, the last one prefilled byte by byte."""
    pytest.importorskip("tokenizers")  # the mock backend's tokenizer
    assert main(["bytes", "Once upon", "--backend", "mock", "--sample", "8", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "prompt as the model sees it: b'<s> Once' + b' upon' prefilled" in out
    assert "P(token boundary here)" in out
    assert out.strip().splitlines()[-1].startswith("Once upon")
    assert main(["bytes", "Once upon", "--backend", "mock", "--sample", "8", "--seed", "3"]) == 0
    assert capsys.readouterr().out == out


def test_cli_sample_shows_its_progress_unless_asked_not_to(capsys):
    """``--sample N`` draws a progress bar on stderr counting the bytes drawn, as
    ``genlm smc`` counts its steps, and ``--no-progress`` hides it, the output unchanged (a
    long sample showed nothing until its end)."""
    argv = ["bytes", "Once upon", "--backend", "mock", "--sample", "8", "--seed", "3"]
    assert main(argv) == 0
    shown = capsys.readouterr()
    assert re.search(r"sample: 100%\|.*\| 8/8 ", shown.err), shown.err
    assert main([*argv, "--no-progress"]) == 0
    hidden = capsys.readouterr()
    assert hidden.err == "" and hidden.out == shown.out


def test_cli_shows_the_whole_prompt_and_explains_the_beam(capsys, no_tokenizer):
    """The whole prompt is shown (context + prefilled bytes); the beam size is the state's."""
    assert main(["bytes", "Once upon", "--backend", "mock", "--beam", "4", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "prompt as the model sees it: b'<s>' + b'Once upon' prefilled byte by byte" in out
    size = int(re.search(r"beam: (\d+) tokenizations .*--beam 4 heaviest", out).group(1))
    shares = [float(m) for m in re.findall(r"^  (\d\.\d{4})  ", out, flags=re.M)]

    async def expected():
        async with ByteLM(MockLM.from_name("stories260K"), K=4, close_lm=True) as byte_lm:
            state = await byte_lm.initial(b"Once upon")
            return len(state), [math.exp(c.weight - state.logZ) for c in state.candidates]

    n, expected_shares = asyncio.run(expected())
    assert size == n
    assert shares == [round(s, 4) for s in expected_shares[:8]]


def test_cli_sample_stops_at_the_context_limit_and_prints_what_it_drew(capsys, monkeypatch):
    """``--sample`` past the model's context limit prints the bytes drawn, then why it
    stopped (it used to fail and lose them); a mock with a limit of 8 tokens stands in."""
    plain = MockLM.from_name.__func__
    monkeypatch.setattr(
        MockLM,
        "from_name",
        classmethod(lambda cls, name, **kw: plain(cls, name, max_context_length=8, **kw)),
    )
    assert main(["bytes", "Once upon", "--backend", "mock", "--sample", "500", "--seed", "3"]) == 0
    *_, sample, note = capsys.readouterr().out.strip().splitlines()
    assert sample.startswith("Once upon") and len(sample) > len("Once upon")
    stopped = re.fullmatch(
        r"\(stopped after (\d+) bytes: the model's context limit, 8 tokens\)", note
    )
    assert stopped and int(stopped[1]) > 0


def _serve_mock(monkeypatch, vocab, tokenizer) -> None:
    """The mock backend loads over ``vocab`` with ``tokenizer``, whatever model is named."""
    monkeypatch.setattr(
        MockLM,
        "from_name",
        classmethod(lambda cls, name, **kw: cls(vocab, tokenizer=tokenizer, **kw)),
    )


class _TextOnlyTokenizer:
    """The tokenizer backends document: ``encode(text) -> list[int]``, no keywords (one
    token per UTF-8 byte)."""

    def encode(self, text):
        return list(text.encode("utf-8"))


def test_cli_takes_a_tokenizer_whose_encode_takes_the_text_alone(capsys, monkeypatch):
    """A tokenizer with ``encode(text)`` only (tiktoken's shape) serves ``genlm bytes`` as
    it serves ``genlm smc``; it failed with a TypeError on ``add_special_tokens``. Its ids
    but the last are the context, the last one's bytes prefilled."""
    vocab = [bytes([b]) for b in range(256)]
    _serve_mock(monkeypatch, vocab, _TextOnlyTokenizer())
    assert main(["bytes", "Once", "--backend", "mock"]) == 0
    assert "prompt as the model sees it: b'Onc' + b'e' prefilled" in capsys.readouterr().out


class _AddsBOS(_TextOnlyTokenizer):
    """``encode(text)`` that puts the BOS id (0 here) first itself."""

    def encode(self, text):
        return [0, *super().encode(text)]


def test_cli_keeps_one_bos_when_the_tokenizer_adds_it(capsys, monkeypatch):
    """A tokenizer whose plain ``encode`` starts with the BOS gets one BOS, as ``genlm smc``
    gives it, not two."""
    from genlm.core import Vocabulary

    vocab = Vocabulary([b"<s>", *(bytes([b]) for b in range(1, 256))], {0}, bos_token_id=0)
    _serve_mock(monkeypatch, vocab, _AddsBOS())
    assert main(["bytes", "Once", "--backend", "mock"]) == 0
    out = capsys.readouterr().out
    assert "prompt as the model sees it: b'<s>Onc' + b'e' prefilled" in out
    assert "context tokens: '<s>'#0 | 'O'#79 |" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seed", "-1"], "--seed must be an integer >= 0, got -1"),
        (["--temperature", "inf"], "--temperature: temperature must be finite and >= 0"),
        (["--temperature", "nan"], "--temperature: temperature must be finite and >= 0"),
        (["--temperature", "-1"], "--temperature: temperature must be finite and >= 0"),
        (["--temperature", "1e-310"], "--temperature: temperature 1e-310 is too small"),
        (["--beam", "0"], "--beam must be a positive integer, got 0"),
        (["--top", "0"], "--top must be a positive integer, got 0"),
        (["--sample", "-1"], "--sample must be >= 0, got -1"),
        (["--model", ""], "--model is empty: name one"),  # it fell back to stories260K
    ],
)
def test_cli_bad_numbers_are_one_line_before_loading(argv, message, capsys, monkeypatch):
    """Each bad number ends the command with one stderr line naming the option, before the
    model loads (--seed -1 and --temperature inf used to print the whole distribution and
    then fail)."""
    from genlm.core.backend import BackendSpec

    def forbidden(self, model, **opts):
        raise AssertionError(f"a model was loaded: {model!r}")

    monkeypatch.setattr(BackendSpec, "load", forbidden)
    assert main(["bytes", "Hi", "--backend", "mock", "--sample", "3", *argv]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.strip().splitlines()
    assert line.startswith(f"genlm bytes: error: {message}"), line


def test_cli_a_prompt_that_is_not_utf8_is_one_line_before_loading(capsys, monkeypatch):
    """A prompt argument holding bytes the locale could not decode (``$'caf\\xe9'``: Python
    sees a surrogate) is named in one line, before the model loads."""
    from genlm.core.backend import BackendSpec

    def forbidden(self, model, **opts):
        raise AssertionError(f"a model was loaded: {model!r}")

    monkeypatch.setattr(BackendSpec, "load", forbidden)
    prompt = os.fsdecode(b"caf\xe9")
    assert main(["bytes", prompt, "--backend", "mock"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == "genlm bytes: error: the prompt is not valid UTF-8 text: b'caf\\xe9'"


class _EndsWithSpecial(_TextOnlyTokenizer):
    """``encode(text)`` reading the literal ``<|end|>`` as the special token 256."""

    def encode(self, text):
        head, sep, tail = text.partition("<|end|>")
        return super().encode(head) + ([256] + self.encode(tail) if sep else [])


def test_cli_keeps_a_special_last_token_in_the_context(capsys, monkeypatch):
    """A prompt ending in a special token (a chat header's end) keeps it: it has no bytes
    to prefill, so it stays in the context (it was dropped, and the model never saw it)."""
    from genlm.core import Vocabulary

    vocab = Vocabulary([*(bytes([b]) for b in range(256)), b"<|end|>"], {256})
    _serve_mock(monkeypatch, vocab, _EndsWithSpecial())
    assert main(["bytes", "Hi<|end|>", "--backend", "mock"]) == 0
    out = capsys.readouterr().out
    assert "context tokens: 'H'#72 | 'i'#105 | '<|end|>'#256" in out, out
