"""Build random-weight Llama models in Hugging Face format around a real tokenizer.

Tests and benchmarks need models of controlled shape that load offline in every
backend (hf, vllm, mlx). Weights are drawn from a fixed seed, so a directory is
reproducible; :func:`cached_random_llama` builds each shape once per machine.

Run as a script to build one: ``python tests/support/random_llama.py OUT --preset bench53m``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_TOKENIZERS = next(
    (p / "shared" / "models" / "tokenizers" for p in REPO.parents if (p / "shared").is_dir()),
    REPO.parent / "shared" / "models" / "tokenizers",
)
FIXTURE_TOKENIZERS = REPO / "tests" / "fixtures" / "tokenizers"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)

#: Named shapes. ``bench53m`` is the 53M-parameter benchmark model (hidden 512, 8 layers);
#: ``tiny`` is a head-dim-64 model small enough for every test (vLLM needs head dim 64).
#: ``tiny_mild`` is ``tiny`` with initializer range 0.1 instead of 0.5: its rows still span
#: about 10 nats (a mixed-up row is off by whole nats), but fp32 round-off stays below 1e-5
#: (``tiny``'s own fp32 forward is up to 3e-4 from its fp64 forward), so two fp32 engines can
#: honestly be compared at 1e-4 on it.
_TINY = dict(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=256)
PRESETS = {
    "tiny": _TINY,
    "tiny_mild": dict(_TINY, initializer_range=0.1),
    "bench53m": dict(
        hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=8, intermediate_size=1536
    ),
}


def tokenizer_dir(name: str) -> Path:
    """A real tokenizer directory: committed fixture if present, else ``../shared``."""
    for base in (FIXTURE_TOKENIZERS, SHARED_TOKENIZERS):
        if (base / name).is_dir():
            return base / name
    raise FileNotFoundError(
        f"tokenizer {name!r} not found in {FIXTURE_TOKENIZERS} or {SHARED_TOKENIZERS}"
    )


def build_random_llama(
    out_dir: str | Path,
    tokenizer: str | Path = "gpt2",
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
    initializer_range: float = 0.5,
    seed: int = 0,
) -> Path:
    """Write a random-weight ``LlamaForCausalLM`` (fp32, safetensors) plus tokenizer files.

    ``initializer_range`` is large on purpose: with the usual 0.02 every next-token
    distribution is nearly uniform, which hides bugs that mix up rows or positions.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok_dir = Path(tokenizer) if Path(tokenizer).is_dir() else tokenizer_dir(str(tokenizer))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=initializer_range,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tok_dir / name).exists():
            shutil.copyfile(tok_dir / name, out / name)
    return out


def cached_random_llama(preset: str = "tiny", tokenizer: str = "gpt2", seed: int = 0) -> Path:
    """The directory of a preset model, built once under ``~/.cache/genlm-test-models``."""
    spec = dict(PRESETS[preset], tokenizer=tokenizer, seed=seed, version=1)
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    out = Path.home() / ".cache" / "genlm-test-models" / f"{preset}-{tokenizer}-{digest}"
    if not (out / "model.safetensors").exists():
        tmp = out.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        build_random_llama(tmp, tokenizer, seed=seed, **PRESETS[preset])
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--tokenizer", default="gpt2")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = build_random_llama(args.out, args.tokenizer, seed=args.seed, **PRESETS[args.preset])
    print(path)


if __name__ == "__main__":
    main()
