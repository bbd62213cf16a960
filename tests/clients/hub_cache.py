"""Build an offline Hugging Face Hub cache in which the clients' Hub model names resolve locally.

genlm-control's and llamppl's test suites load ``gpt2`` and ``openai-community/gpt2`` both
through ``genlm.backend`` and directly through ``transformers`` (``AutoTokenizer``,
``GPT2Tokenizer``). One mechanism serves both paths without touching their test files: a Hub
cache directory (``HF_HUB_CACHE``, read with ``HF_HUB_OFFLINE=1``) holding, under each name,
the real GPT-2 tokenizer (``tests/fixtures/tokenizers/gpt2``) and a small GPT-2 model with
random weights built from its config (same vocabulary, 2 layers, seeded, about 13 MB).

Usage: ``python tests/clients/hub_cache.py DEST``; then ``HF_HUB_CACHE=DEST HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

GPT2_TOKENIZER = Path(__file__).parents[1] / "fixtures" / "tokenizers" / "gpt2"
#: Hub names the clients' tests load, all served by the same local GPT-2.
NAMES = ("gpt2", "openai-community/gpt2")
#: A fixed fake commit: the snapshot folder name the cache's refs/main points to.
REVISION = "0" * 40


def build_gpt2(dest: Path) -> None:
    """A random-weight GPT-2 (seeded) with the real GPT-2 tokenizer, saved in ``dest``."""
    import torch
    import transformers

    torch.manual_seed(0)
    # n_ctx: the real GPT-2 config has it and mlx-lm requires it.
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=1024, n_ctx=1024)
    config.architectures = ["GPT2LMHeadModel"]
    # Saved as the base GPT2Model, like the Hub's checkpoint: unprefixed weight names (which
    # mlx-lm expects), the LM head tied to the embeddings.
    model = transformers.GPT2LMHeadModel(config).eval()
    model.transformer.save_pretrained(dest)
    config.save_pretrained(dest)
    for f in GPT2_TOKENIZER.iterdir():
        if f.suffix in (".json", ".txt"):
            shutil.copy(f, dest / f.name)


def build(cache: Path) -> None:
    """Fill ``cache`` (a Hub cache directory) with a snapshot for every name in NAMES."""
    cache.mkdir(parents=True, exist_ok=True)
    source = cache / "_gpt2"
    if not (source / "config.json").exists():
        build_gpt2(source)
    for name in NAMES:
        repo = cache / ("models--" + name.replace("/", "--"))
        snapshot = repo / "snapshots" / REVISION
        if snapshot.exists():
            shutil.rmtree(snapshot)
        shutil.copytree(source, snapshot)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
