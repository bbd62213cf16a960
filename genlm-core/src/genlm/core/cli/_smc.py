"""``genlm smc "PROMPT"``: sequential Monte Carlo continuations of a prompt."""

from __future__ import annotations

import argparse
import logging
from collections import defaultdict

from genlm.core._models import DEFAULT_MODEL
from genlm.core.cli import CLIError, Command
from genlm.core.cli._args import fraction, positive_float, positive_int

logger = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="text to continue")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model name, hub id or path")
    parser.add_argument("--backend", default=None, help="backend name (default: best available)")
    parser.add_argument("--particles", type=positive_int, default=8, help="number of particles")
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="tokens per particle")
    parser.add_argument(
        "--temperature", type=positive_float, default=1.0, help="proposal temperature"
    )
    parser.add_argument(
        "--ess-threshold",
        type=fraction,
        default=0.5,
        help="resample when the effective sample size falls below this fraction of particles",
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def encode_prompt(lm, prompt: str) -> list[int]:
    """Token ids of ``prompt`` with the tokenizer's special tokens (BOS)."""
    if lm.tokenizer is None:
        raise CLIError(f"{lm!r} has no tokenizer, so it cannot encode a text prompt")
    ids = list(lm.tokenizer.encode(prompt))
    bos = lm.vocab.bos_token_id
    if bos is not None and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    return ids


def decode(lm, tokens: list[int]) -> str:
    eos = set(lm.vocab.eos_token_ids)
    text = lm.vocab.decode([t for t in tokens if t not in eos])
    return text.decode("utf-8", errors="replace")


async def _main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from genlm.core.cli._load import load_model
    from genlm.core.smc import smc

    lm = load_model(args.model, args.backend)
    async with lm:
        prompt = encode_prompt(lm, args.prompt)
        with tqdm(total=args.max_tokens, desc="smc", unit="tok", disable=args.no_progress) as bar:
            result = await smc(
                lm,
                prompt,
                n_particles=args.particles,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                ess_threshold=args.ess_threshold,
                seed=args.seed,
                on_step=lambda _: bar.update(1),
            )
        totals: dict[str, float] = defaultdict(float)
        for particle, weight in zip(result.particles, result.weights):
            totals[decode(lm, particle.tokens)] += float(weight)
        print(f"log marginal likelihood estimate: {result.log_marginal:.4f}")
        print(f"resampled {result.resampled} times; {len(totals)} distinct continuations\n")
        for text, weight in sorted(totals.items(), key=lambda kv: -kv[1]):
            print(f"{weight:.4f}  {args.prompt}{text}")
    return 0


def run(args: argparse.Namespace) -> int:
    import asyncio

    return asyncio.run(_main(args))


COMMAND = Command(
    name="smc",
    help="continue a prompt with sequential Monte Carlo and print weighted continuations",
    configure=configure,
    run=run,
)
