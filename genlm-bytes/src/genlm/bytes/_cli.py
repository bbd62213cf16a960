"""``genlm bytes "PROMPT"``: the next-byte distribution after a prompt, and byte sampling."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import sys

from genlm.bytes._dist import EOS, EOT

logger = logging.getLogger(__name__)


async def prompt_state(byte_lm, prompt: str):
    """The state after ``prompt``: its tokens as context, the last token re-opened.

    The tokenizer's own tokens (with BOS) are the context, except the last one whose
    bytes are prefilled, so the continuation may still extend that token. Without a
    tokenizer the prompt bytes are prefilled from BOS.
    """
    lm = byte_lm.lm
    if lm.tokenizer is None:
        return await byte_lm.initial(prompt.encode("utf-8"))
    ids = list(lm.tokenizer.encode(prompt, add_special_tokens=False))
    bos = lm.vocab.bos_token_id
    context = ([bos] if bos is not None else []) + ids[:-1]
    if not context:
        return await byte_lm.initial(prompt.encode("utf-8"))
    state = await byte_lm.initial(context)
    return await state.prefill(lm.vocab.decode(ids[-1:]))


def _show(symbol: int) -> str:
    if symbol == EOS:
        return "<EOS>"
    if symbol == EOT:
        return "<EOT>"
    return repr(bytes([symbol]))[1:]


async def _main(args: argparse.Namespace) -> int:
    from genlm.bytes._bytelm import ByteLM
    from genlm.core._models import DEFAULT_MODEL
    from genlm.core.cli._load import load_model

    lm = load_model(args.model or DEFAULT_MODEL, args.backend)
    async with ByteLM(lm, K=args.beam, close_lm=True) as byte_lm:
        state = await prompt_state(byte_lm, args.prompt)
        dist = await state.logp_next()
        print(f"after {state.data!r} (beam {len(state)}, log P = {state.logZ:.4f}):")
        print(f"  P(token boundary here) = {2.718281828459045**dist.log_eot:.4f}")
        for symbol, logp in dist.top(args.top):
            print(f"  {_show(symbol):>8}  {logp:9.4f}  {math.exp(logp):.4f}")
        if args.sample:
            out = await state.sample(args.sample, seed=args.seed, temperature=args.temperature)
            sys.stdout.write(args.prompt)
            sys.stdout.write(out.data.decode("utf-8", errors="replace"))
            sys.stdout.write(" <EOS>\n" if out.eos else "\n")
    return 0


def check_args(args: argparse.Namespace) -> None:
    """Reject bad numbers before the model loads.

    Raises:
        CLIError: naming the first bad argument.
    """
    from genlm.core.cli import CLIError

    if args.beam < 1:
        raise CLIError(f"--beam must be a positive integer, got {args.beam}")
    if args.top < 1:
        raise CLIError(f"--top must be a positive integer, got {args.top}")
    if args.sample < 0:
        raise CLIError(f"--sample must be >= 0, got {args.sample}")
    if not args.temperature >= 0:
        raise CLIError(f"--temperature must be >= 0 (0: greedy), got {args.temperature}")


def run(args: argparse.Namespace) -> int:
    check_args(args)
    return asyncio.run(_main(args))
