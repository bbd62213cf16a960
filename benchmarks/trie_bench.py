"""Benchmark genlm.core's TokenByteTrie against genlm-bytes 0.2.0's TokenByteTrie.

Both run on CPU on the same byte vocabularies (gpt2: 50,257 tokens; llama3.2:
128,256) and the same random distributions; times are medians of repeated
runs. The reference runs in its own venv (it needs torch), in a subprocess of
this script: ``--ref-python /work/venvs/ref-bytes/bin/python``; without it the
reference columns say so. The reference is used with its defaults (torch's
default CPU threads, float32 weights). Ours is float64, timed with each kernel:
C (the default where it was built) and the numpy fallback; batched calls split
their rows over one thread per usable CPU, as by default.

Usage: python benchmarks/trie_bench.py [--ref-python PATH] [--repeats N] [--out FILE]
Writes benchmarks/results/trie.md (or ``--out``), keeping its dated ``###`` notes.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

import numpy as np
from _common import require_reference, write_results

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VOCABS = ("gpt2", "llama3.2")
BATCHES = (1, 32)


def tokenizers_dir() -> Path:
    """``<repo>/../shared/models/tokenizers``, looking further up for worktrees."""
    for d in REPO.parents:
        if (d / "shared" / "models" / "tokenizers").is_dir():
            return d / "shared" / "models" / "tokenizers"
    return REPO.parent / "shared" / "models" / "tokenizers"


def load_vocab(name: str) -> tuple[list[bytes], list[int], int]:
    """Byte strings by id, the special (added) ids, and the EOS id, via genlm-core."""
    from genlm.core import Vocabulary

    vocab = Vocabulary.from_tokenizer_json(tokenizers_dir() / name)
    eos = 50256 if name == "gpt2" else 128001
    special = sorted(vocab.special_ids - {eos}) if name == "gpt2" else sorted(vocab.special_ids)
    return list(vocab.tokens), special, eos


def weights(V: int, B: int) -> np.ndarray:
    """B rows of a peaked random distribution over V tokens (float64)."""
    rng = np.random.default_rng(0)
    return rng.dirichlet(np.full(V, 0.1), size=B)


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


@contextmanager
def pool_off():
    """The trie's output pool turned off for the duration (its limit restored after)."""
    from genlm.core import set_trie_pool_limit

    previous = set_trie_pool_limit(0)
    try:
        yield
    finally:
        set_trie_pool_limit(previous)


def bench_ours(repeats: int, kernel: str) -> dict:
    """Time our trie with one kernel. The numpy kernel runs with the output pool off,
    as where genlm-core was installed without a C compiler (no C module, no pool)."""
    with pool_off() if kernel == "numpy" else nullcontext():
        return _bench_ours(repeats, kernel)


def _bench_ours(repeats: int, kernel: str) -> dict:
    from genlm.core._trie import TokenByteTrie

    res = {}
    for name in VOCABS:
        vocab, special, eos = load_vocab(name)
        builds = []
        for _ in range(3):
            t0 = time.perf_counter()
            trie = TokenByteTrie(vocab, eos_token_ids=[eos], atomic_ids=special, kernel=kernel)
            builds.append(time.perf_counter() - t0)
        r = {
            "build_s": statistics.median(builds),
            "nodes": trie.num_nodes,
            "vocab": trie.vocab_size,
            "threads": trie.threads,
        }
        for B in BATCHES:
            W = weights(len(vocab), B)
            if B == 1:
                w, lp = W[0], np.log(W[0])
                r["sum_1"] = median_ms(partial(trie.weight_sum, w), repeats * 5)
                r["max_1"] = median_ms(partial(trie.weight_max, w), repeats * 5)
                r["logsum_1"] = median_ms(partial(trie.log_weight_sum, lp), repeats * 5)
            else:
                LP = np.log(W)
                r[f"sum_{B}"] = median_ms(partial(trie.batch_weight_sum, W), repeats)
                r[f"max_{B}"] = median_ms(partial(trie.batch_weight_max, W), repeats)
                r[f"logsum_{B}"] = median_ms(partial(trie.batch_log_weight_sum, LP), repeats)
                # Without the pool: above 32 MiB (llama3.2), each output is then fresh
                # memory from the OS, as for a caller that keeps every output. (The
                # numpy kernel runs without it throughout: its sum_B is this already.)
                if kernel == "numpy":
                    r[f"sumfresh_{B}"] = r[f"sum_{B}"]
                else:
                    with pool_off():
                        r[f"sumfresh_{B}"] = median_ms(partial(trie.batch_weight_sum, W), repeats)
        res[name] = r
    return res


def copy_bandwidth() -> float:
    """Bytes per second one thread moves (read + write) copying a 64 MiB float64 array."""
    src = np.ones(1 << 23)
    dst = np.empty_like(src)
    seconds = median_ms(partial(np.copyto, dst, src), 9) / 1e3
    return 2 * src.nbytes / seconds


def floor_note(ours: dict) -> str:
    """How close batch-1 weight_sum gets to the memory floor: read V weights, write N masses."""
    bandwidth = copy_bandwidth()
    parts = []
    for name in VOCABS:
        o = ours[name]
        floor_ms = 8 * (o["vocab"] + o["nodes"]) / bandwidth * 1e3
        parts.append(
            f"{name} {floor_ms:.2f} ms (ours {o['sum_1']:.2f} ms, {o['sum_1'] / floor_ms:.1f}x)"
        )
    return (
        "Memory floor at batch 1 (reading the V float64 weights and writing the N float64 "
        f"masses once, at the {bandwidth / 1e9:.1f} GB/s one thread copies a 64 MiB array "
        "here, counting bytes read and written): " + "; ".join(parts) + ". The rest is the "
        "random access: each token's weight is read in token order to a node in node order, "
        "and each node is read again when folded into its parent."
    )


def batch_note(ours: dict) -> str:
    """Why reusing freed outputs matters at batch 32, with the measured difference."""
    B = BATCHES[-1]
    parts = [
        f"{name} {ours[name][f'sum_{B}']:.1f} ms with the pool, "
        f"{ours[name][f'sumfresh_{B}']:.1f} ms without ({B * ours[name]['nodes'] * 8 / 2**20:.0f}"
        " MiB)"
        for name in VOCABS
    ]
    return (
        f"Outputs: at batch {B}, weight_sum's float64 output is large, and glibc maps every "
        "allocation above 32 MiB afresh, so a call whose output is new memory also pays the "
        "OS for zeroing and faulting in each page. genlm-core keeps up to 256 MiB of freed "
        "outputs (of 1 MiB or more) for reuse (`set_trie_pool_limit`); the rows above reuse "
        "them, as a caller that drops each output before the next call does. The "
        '"pool off" rows turn it off: glibc then still recycles outputs under 32 MiB, but '
        "maps every larger one afresh, which is also what a caller that keeps every output "
        "gets: " + "; ".join(parts) + ". "
        "Fresh pages cost more or less depending on how readily the OS hands out huge pages, "
        "so those rows vary more between runs. The numpy-kernel column always runs without "
        "the pool (it is part of the C module)."
    )


def bench_ref(repeats: int) -> dict:
    """Runs inside the reference venv."""
    import warnings

    import torch

    from genlm.bytes.trie import TokenByteTrie, TrieMode

    require_reference("genlm-bytes")
    warnings.filterwarnings("ignore")
    res = {"torch_threads": torch.get_num_threads()}
    with open(os.environ["GENLM_TRIE_BENCH_VOCABS"], "rb") as f:
        vocabs = pickle.load(f)
    for name in VOCABS:
        vocab, special, eos = vocabs[name]
        t0 = time.perf_counter()
        # Plain bytes (its deprecated-but-supported input), EOS by byte string,
        # special tokens atomic: the closest match to our configuration.
        trie = TokenByteTrie(
            vocab,
            device="cpu",
            atomic_byte_strings=[vocab[i] for i in special],
            eos_byte_strings=[vocab[eos]],
        )
        r = {"build_s": time.perf_counter() - t0, "nodes": len(trie.children)}
        for B in BATCHES:
            W = torch.tensor(weights(len(vocab), B), dtype=torch.float32)
            n = repeats * 5 if B == 1 else repeats
            if B == 1:
                r["sum_1"] = median_ms(partial(trie.weight_sum, W[0], TrieMode.WITH_EOS), n)
                r["max_1"] = median_ms(partial(trie.weight_max, W[0]), n)
            else:
                r[f"sum_{B}"] = median_ms(partial(trie.batch_weight_sum, W, TrieMode.WITH_EOS), n)
                r[f"max_{B}"] = median_ms(partial(trie.batch_weight_max, W), n)
        res[name] = r
    return res


def table(ours: dict, fallback: dict, ref: dict | None, note: str, command: str) -> str:
    threads = ours[VOCABS[0]]["threads"]
    lines = [
        "## Token-byte trie: genlm.core vs genlm-bytes 0.2.0",
        "",
        "CPU only, same vocabularies and distributions; median ms per call (build: seconds).",
        "Ours: float64, default settings: the C kernel, batched rows split over",
        f"{threads} thread(s) (one per usable CPU); the numpy fallback kernel (used where",
        "genlm-core was installed without a C compiler) in its own column.",
        "Reference: genlm-bytes 0.2.0 `TokenByteTrie` (torch sparse CSR matmul for sums,",
        f"`scatter_reduce` for maxes), default settings, float32. {note}",
        f"Command: `{command}`.",
        "",
        "| vocab | nodes (ours / ref) | op | batch | ours | ours, numpy kernel | reference "
        "| speed-up |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in VOCABS:
        o, f, r = ours[name], fallback[name], (ref or {}).get(name, {})
        nodes = f"{o['nodes']:,} / {r['nodes']:,}" if r else f"{o['nodes']:,} / -"
        rows = [("build (s)", "-", "build_s", "build_s")]
        for B in BATCHES:
            rows += [
                ("weight_sum", B, f"sum_{B}", f"sum_{B}"),
                ("weight_max", B, f"max_{B}", f"max_{B}"),
                ("log_weight_sum", B, f"logsum_{B}", None),
            ]
            if B > 1:
                rows.append(("weight_sum, pool off", B, f"sumfresh_{B}", f"sum_{B}"))
        for op, B, key, ref_key in rows:
            ov, fv, rv = o.get(key), f.get(key), r.get(ref_key)
            fmt = "{:.2f}" if key == "build_s" else "{:.3g}"
            lines.append(
                f"| {name} | {nodes} | {op} | {B} | {fmt.format(ov)} | {fmt.format(fv)} | "
                + (fmt.format(rv) if rv is not None else "-")
                + " | "
                + (f"{rv / ov:.1f}x" if rv is not None else "-")
                + " |"
            )
    return "\n".join(lines) + "\n\n" + floor_note(ours) + "\n\n" + batch_note(ours) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref-python", help="python of a venv with genlm-bytes==0.2.0")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "trie.md")
    ap.add_argument("--ref-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ref_worker:
        print(json.dumps(bench_ref(args.repeats)))
        return
    ours, fallback = bench_ours(args.repeats, "c"), bench_ours(args.repeats, "numpy")
    ref, note = None, "Reference not run (no --ref-python given)."
    if args.ref_python and Path(args.ref_python).exists():
        with tempfile.NamedTemporaryFile(suffix=".pkl") as f:
            pickle.dump({name: load_vocab(name) for name in VOCABS}, f)
            f.flush()
            out = subprocess.run(
                [args.ref_python, __file__, "--ref-worker", "--repeats", str(args.repeats)],
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, "GENLM_TRIE_BENCH_VOCABS": f.name},
            )
        if out.returncode != 0:
            raise SystemExit(f"the reference worker failed:\n{out.stderr[-4000:]}")
        ref = json.loads(out.stdout.strip().splitlines()[-1])
        note = f"Reference torch threads: {ref['torch_threads']}."
    elif args.ref_python:
        note = f"Reference not run ({args.ref_python} not found)."
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    note += f" Load average at the end (1/5/15 min): {load}; CPUs: {os.cpu_count()}."
    command = "python benchmarks/trie_bench.py" + (
        " --ref-python PATH_TO_REF_VENV/bin/python" if ref else ""
    )
    md = table(ours, fallback, ref, note, command)
    write_results(args.out, md)
    print(md)


if __name__ == "__main__":
    sys.exit(main())
