"""``genlm bytes "PROMPT"``: the next-byte distribution after a prompt, and byte sampling."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys

from genlm.bytes._dist import EOS, EOT

logger = logging.getLogger(__name__)

#: How many beam candidates to list.
SHOWN = 8


async def prompt_state(byte_lm, prompt: str):
    """The state after ``prompt`` and the token context it starts from.

    The tokenizer's own tokens (with BOS) are the context, except the last one whose
    bytes are prefilled, so the continuation may still extend that token; a last token
    with no bytes (a special one, such as a chat header's end) stays in the context. Without a
    tokenizer the prompt bytes are prefilled from BOS (or from the longest first token
    when there is no BOS). The context returned is the token ids every candidate starts
    with.
    """
    from genlm.core.cli import encode_text

    lm = byte_lm.lm
    if lm.tokenizer is not None:
        ids = encode_text(lm.tokenizer, prompt)
        bos = lm.vocab.bos_token_id
        if bos is not None and ids[:1] == [bos]:  # a tokenizer that adds it itself
            ids = ids[1:]
        last = lm.vocab.decode(ids[-1:])
        if ids and not last:  # a special token (a chat header's end) has no bytes to prefill
            context = ([bos] if bos is not None else []) + ids
            return await byte_lm.initial(context), tuple(context)
        context = ([bos] if bos is not None else []) + ids[:-1]
        if context:
            state = await byte_lm.initial(context)
            return await state.prefill(last), tuple(context)
    state = await byte_lm.initial(prompt.encode("utf-8"))
    return state, tuple(os.path.commonprefix([c.context for c in state.candidates]))


def describe(state, context: tuple[int, ...], beam: int) -> list[str]:
    """Lines that say what the prompt became and what the beam holds.

    The beam holds the ways to tokenize the prefilled bytes that pruning kept: a
    candidate is the tokens committed after the context (shown with their ids: two
    tokens can have the same bytes) plus a partial token, the bytes of a token not
    finished yet. Before each byte the beam is cut to the ``--beam`` heaviest
    candidates; the byte can then split one candidate in several, so a beam may hold
    more than ``--beam`` candidates between steps.
    """
    vocab = state.byte_lm.lm.vocab

    def spell(ids) -> str:
        return (
            " | ".join(f"{repr(vocab.decode([i], keep_special=True))[1:]}#{i}" for i in ids)
            or "(none)"
        )

    lines = [
        f"prompt as the model sees it: {vocab.decode(context, keep_special=True)!r}"
        f" + {state.data!r} prefilled byte by byte",
        f"  context tokens: {spell(context)}",
        f"  log P({state.data!r} | context) = {state.logZ:.4f}",
        f"beam: {len(state)} tokenizations of the prefilled bytes (cut to the --beam {beam}"
        " heaviest before each byte, so there can be more after one);"
        " share, committed tokens, partial token:",
    ]
    for c in state.candidates[:SHOWN]:
        share = math.exp(c.weight - state.logZ)
        partial = state.byte_lm.trie.prefix(c.node)
        lines.append(f"  {share:.4f}  {spell(c.context[len(context) :])}  {partial!r}")
    if len(state) > SHOWN:
        lines.append(f"  ... {len(state) - SHOWN} more")
    return lines


def _show(symbol: int) -> str:
    if symbol == EOS:
        return "<EOS>"
    if symbol == EOT:
        return "<EOT>"
    return repr(bytes([symbol]))[1:]


async def _main(args: argparse.Namespace, lm) -> int:
    from genlm.bytes._bytelm import ByteLM
    from genlm.core.cli import progress_bar

    async with ByteLM(lm, K=args.beam, close_lm=True) as byte_lm:
        state, context = await prompt_state(byte_lm, args.prompt)
        dist = await state.logp_next()
        print("\n".join(describe(state, context, args.beam)))
        print(f"next byte after {args.prompt!r}:")
        print(f"  P(token boundary here) = {math.exp(dist.log_eot):.4f}")
        for symbol, logp in dist.top(args.top):
            print(f"  {_show(symbol):>8}  {logp:9.4f}  {math.exp(logp):.4f}")
        if args.sample:
            with progress_bar(args, args.sample, desc="sample", unit="byte") as bar:
                out = await state.sample(
                    args.sample,
                    seed=args.seed,
                    temperature=args.temperature,
                    on_step=lambda _: bar.update(1),
                )
            sys.stdout.write(args.prompt)
            sys.stdout.write(out.data.decode("utf-8", errors="replace"))
            sys.stdout.write(" <EOS>\n" if out.eos else "\n")
            if out.at_limit:
                print(
                    f"(stopped after {len(out.data)} bytes: the model's context limit,"
                    f" {lm.max_context_length} tokens)"
                )
    return 0


def check_args(args: argparse.Namespace) -> None:
    """Reject bad arguments, every one of them, before the model loads (a ``CLIError``
    naming the first)."""
    from genlm.core.backend import check_temperature
    from genlm.core.cli import CLIError, check_prompt

    check_prompt(args.prompt)
    if args.beam < 1:
        raise CLIError(f"--beam must be a positive integer, got {args.beam}")
    if args.top < 1:
        raise CLIError(f"--top must be a positive integer, got {args.top}")
    if args.sample < 0:
        raise CLIError(f"--sample must be >= 0, got {args.sample}")
    if args.seed is not None and args.seed < 0:
        raise CLIError(f"--seed must be an integer >= 0, got {args.seed}")
    try:
        check_temperature(args.temperature)
    except ValueError as exc:
        raise CLIError(f"--temperature: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    from genlm.core.cli import load_model, run_with

    check_args(args)
    # Loaded before the event loop starts: a Ctrl-C during the load stops it at once.
    lm = load_model(args.model, args.backend, progress=not args.no_progress)
    return run_with(lm, _main(args, lm))
