"""``genlm smc "PROMPT"``: sequential Monte Carlo continuations of a prompt.

With ``--forbid CHARS`` the target is the model conditioned on a continuation without
those characters, so particles' weights differ (a particle that had to avoid likely
tokens loses weight) and resampling moves particles to the heavy ones. The command
prints each particle's normalized weight, the effective sample size, when it resampled,
and the posterior over distinct continuations (weights summed over equal texts).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
from collections import defaultdict

from genlm.core._command import Command
from genlm.core._embedded import DEFAULT_MODEL
from genlm.core.cli._args import (
    ascii_bytes,
    fraction,
    non_negative_int,
    positive_int,
    positive_temperature,
)
from genlm.core.cli._errors import CLIError
from genlm.core.cli._progress import add_progress_option, progress_bar
from genlm.core.cli._prompt import check_prompt

logger = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="text to continue")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model name, hub id or path")
    parser.add_argument("--backend", default=None, help="backend name (default: best available)")
    parser.add_argument("--particles", type=positive_int, default=8, help="number of particles")
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="tokens per particle")
    parser.add_argument(
        "--temperature", type=positive_temperature, default=1.0, help="proposal temperature"
    )
    parser.add_argument(
        "--ess-threshold",
        type=fraction,
        default=0.5,
        help="resample when the effective sample size falls below this fraction of particles",
    )
    parser.add_argument(
        "--forbid",
        type=ascii_bytes,
        default=None,
        metavar="CHARS",
        help="condition on a continuation containing none of these ASCII characters",
    )
    parser.add_argument("--seed", type=non_negative_int, default=None, help="random seed (>= 0)")
    add_progress_option(parser)


def encode_prompt(lm, prompt: str) -> list[int]:
    """Token ids of ``prompt`` with the tokenizer's special tokens (BOS).

    Raises:
        CLIError: the model has no tokenizer; for the mock without ``tokenizers``
            installed, the message says so and how to install it.
    """
    if lm.tokenizer is None:
        from genlm.core.mock import _NO_TOKENIZERS, MockLM

        why = ""
        if isinstance(lm, MockLM) and importlib.util.find_spec("tokenizers") is None:
            why = f": {_NO_TOKENIZERS}"
        raise CLIError(f"{lm!r} has no tokenizer, so it cannot encode a text prompt{why}")
    encoded = lm.tokenizer.encode(prompt)
    ids = list(getattr(encoded, "ids", encoded))  # a tokenizers.Tokenizer's Encoding
    bos = lm.vocab.bos_token_id
    if bos is not None and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    return ids


def decode(lm, tokens: list[int]) -> str:
    eos = set(lm.vocab.eos_token_ids)
    text = lm.vocab.decode([t for t in tokens if t not in eos])
    return text.decode("utf-8", errors="replace")


async def _main(args: argparse.Namespace, lm) -> int:
    from genlm.core.smc import forbid_bytes, smc

    async with lm:
        prompt = encode_prompt(lm, args.prompt)
        mask = None
        if args.forbid is not None:
            mask = forbid_bytes(lm.vocab, args.forbid)
            chars = args.forbid.decode()
            which = f"no {chars!r}" if len(chars) == 1 else f"none of {', '.join(map(repr, chars))}"
            print(
                f"constraint: {which} in the continuation "
                f"({int(mask.sum())} of {len(mask)} tokens allowed)"
            )
        with progress_bar(args, args.max_tokens, desc="smc", unit="tok") as bar:
            result = await smc(
                lm,
                prompt,
                n_particles=args.particles,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                ess_threshold=args.ess_threshold,
                seed=args.seed,
                token_mask=mask,
                on_step=lambda _: bar.update(1),
            )
        print_result(lm, args, result)
    return 0


def printable(text: str) -> str:
    """``text`` on one line: newlines and other control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def print_result(lm, args: argparse.Namespace, result) -> None:
    """Weights, effective sample size, resampling steps and the posterior over texts."""
    texts = [decode(lm, p.tokens) for p in result.particles]
    weights = result.weights
    what = "log P(constraint holds)" if args.forbid else "log Z"
    print(f"{what} estimate: {result.log_marginal:.4f}")
    if not weights.any():
        print("every particle reached a context where no allowed token has positive probability")
    steps = ", ".join(map(str, result.resampled_at))
    print(f"resampled {result.resampled} times" + (f" (after steps {steps})" if steps else ""))
    print(f"effective sample size: {result.ess:.2f} of {len(weights)} particles")
    print("particle weights: " + " ".join(f"{w:.4f}" for w in weights))
    totals: dict[str, float] = defaultdict(float)
    for text, weight in zip(texts, weights):
        totals[text] += float(weight)
    print(f"\nposterior over {len(totals)} distinct continuations:")
    for text, weight in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{weight:.4f}  {printable(args.prompt + text)}")


def run(args: argparse.Namespace) -> int:
    from genlm.core.cli._load import load_model, run_with

    check_prompt(args.prompt)
    lm = load_model(args.model, args.backend, progress=not args.no_progress)
    return run_with(lm, _main(args, lm))


COMMAND = Command(
    name="smc",
    help="continue a prompt with sequential Monte Carlo and print weighted continuations",
    configure=configure,
    run=run,
)
