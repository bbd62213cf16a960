"""Test-only token LMs and brute force for the genlm-bytes tests."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Sequence
from typing import Any

import numpy as np
import pytest

from genlm.bytes import EOS
from genlm.core import Vocabulary
from genlm.core.backend import resolve_model_path


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a test scenario on a fresh event loop."""
    return asyncio.run(coro)


class Float64Stories:
    """Test-only ``AsyncLM`` (the protocol's read side): stories260K, full forward, float64.

    Not a ``BatchedLM`` on purpose: core casts rows to float32, and the exactness tests
    compare to brute force within 1e-9 nats, which needs float64 rows end to end.
    """

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch = pytest.importorskip("torch")
        transformers = pytest.importorskip("transformers")
        path = resolve_model_path("stories260K")
        self._torch = torch
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
        self.model.eval()
        self.vocab = Vocabulary.from_tokenizer(self.tokenizer)
        self.calls = 0
        self._rows: dict[tuple[int, ...], np.ndarray] = {}

    def row(self, token_ids: Sequence[int]) -> np.ndarray:
        """Float64 log-probabilities of the next token (cached per context)."""
        key = tuple(int(t) for t in token_ids)
        hit = self._rows.get(key)
        if hit is None:
            self.calls += 1
            torch = self._torch
            with torch.no_grad():
                logits = self.model(torch.tensor([key])).logits[0, -1]
                hit = torch.log_softmax(logits, dim=-1).numpy().astype(np.float64)
            self._rows[key] = hit
        return hit

    async def next_token_logprobs(self, token_ids: Sequence[int]) -> np.ndarray:
        return self.row(token_ids)


class FixedLM:
    """Test-only ``AsyncLM``: the same next-token distribution after every context."""

    def __init__(self, vocab: Vocabulary, probs: Sequence[float]) -> None:
        self.vocab = vocab
        p = np.asarray(probs, dtype=np.float64)
        with np.errstate(divide="ignore"):
            self._row = np.log(p / p.sum())
        self.contexts: list[tuple[int, ...]] = []

    async def next_token_logprobs(self, token_ids: Sequence[int]) -> np.ndarray:
        self.contexts.append(tuple(token_ids))
        return self._row


def brute_force_prefix_logprob(
    row, vocab: Vocabulary, context: tuple[int, ...], data: bytes, text_ids: set[int]
) -> float:
    """log P(bytes start with ``data``) by enumerating every token sequence reaching its end.

    ``row(ctx)`` gives float64 next-token log-probabilities; only ``text_ids`` spell bytes.
    A sequence counts once: at its first token that covers the last byte of ``data``.
    """
    by_first: dict[int, list[int]] = {}
    for t in text_ids:
        by_first.setdefault(vocab.tokens[t][0], []).append(t)

    def total(ctx: tuple[int, ...], pos: int) -> float:
        lp = row(ctx)
        rest = data[pos:]
        out = 0.0
        for t in by_first.get(rest[0], ()):
            tb = vocab.tokens[t]
            if tb.startswith(rest):
                out += np.exp(lp[t])
            elif rest.startswith(tb):
                out += np.exp(lp[t]) * total(ctx + (t,), pos + len(tb))
        return out

    return float(np.log(total(context, 0))) if data else 0.0


def brute_force_next_symbol(
    lm: Any, context: tuple[int, ...], data: bytes, eos_ids: set[int], prompt: int = 0
) -> np.ndarray:
    """``P(next symbol | data)`` over 256 bytes and EOS by enumerating tokenizations.

    Text tokens are the non-special tokens with bytes that are not EOS. ``P(x)`` sums
    every token sequence whose last token covers the end of ``x`` (its earlier tokens
    end strictly inside ``x``); ``P(x, EOS)`` sums the exact tokenizations of ``x`` times
    the probability of an EOS token next. Plain probabilities (float64), no log space.

    ``prompt``: the first ``prompt`` bytes of ``data`` were prefilled, so a token ending
    inside them may also be an EOS token that has bytes (prefill counts it as text).
    """
    vocab = lm.vocab
    spelled = [t for t, tok in enumerate(vocab.tokens) if tok and t not in vocab.special_ids]

    def row(ctx: tuple[int, ...]) -> np.ndarray:
        return np.exp(np.asarray(lm.next_token_logprobs_sync(ctx), dtype=np.float64))

    def candidates(pos: int) -> list[int]:
        """The tokens that can spell bytes from ``pos`` on: text, and EOS inside the prompt."""
        return [t for t in spelled if t not in eos_ids or pos + len(vocab.tokens[t]) <= prompt]

    def prefix(ctx: tuple[int, ...], pos: int, rest: bytes) -> float:
        """P(the bytes after ``ctx`` start with ``rest``), ``rest`` non-empty, at ``pos``."""
        p = row(ctx)
        out = 0.0
        for t in candidates(pos):
            tok = vocab.tokens[t]
            if tok.startswith(rest):
                out += p[t]
            elif rest.startswith(tok):
                out += p[t] * prefix(ctx + (t,), pos + len(tok), rest[len(tok) :])
        return out

    def ends_then_eos(ctx: tuple[int, ...], pos: int, rest: bytes) -> float:
        """P(the tokens after ``ctx`` spell exactly ``rest``, then EOS)."""
        p = row(ctx)
        if not rest:
            return float(sum(p[e] for e in eos_ids))
        return sum(
            p[t]
            * ends_then_eos(ctx + (t,), pos + len(vocab.tokens[t]), rest[len(vocab.tokens[t]) :])
            for t in candidates(pos)
            if rest.startswith(vocab.tokens[t])
        )

    total = prefix(context, 0, data) if data else 1.0
    out = np.array([prefix(context, 0, data + bytes([b])) for b in range(256)] + [0.0])
    out[EOS] = ends_then_eos(context, 0, data)
    return out / total


async def assert_steps_match_brute_force(
    lm: Any, byte_lm: Any, context: tuple[int, ...], data: bytes, prompt: int
) -> None:
    """Prefill ``data[:prompt]`` after ``context``, then step through the rest of ``data``:
    every next-symbol distribution equals :func:`brute_force_next_symbol` (EOS from
    ``byte_lm``'s ids)."""
    eos_ids = set(byte_lm.eos_ids)
    state = await (await byte_lm.initial(context)).prefill(data[:prompt])
    for i in range(prompt, len(data) + 1):
        expected = brute_force_next_symbol(lm, context, data[:i], eos_ids, prompt)
        got = np.exp((await state.logp_next()).logprobs)
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
        if i < len(data):
            state = await state.advance(data[i])
