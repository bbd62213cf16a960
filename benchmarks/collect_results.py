"""Assemble benchmarks/RESULTS.md from the per-area files in benchmarks/results/.

Each benchmark script writes its own section (`results/<area>.md`), so benchmarks run
independently; this script puts them in a fixed order under one heading.

Usage: python benchmarks/collect_results.py
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
ORDER = ["core", "trie", "hf", "bytes", "mlx", "vllm"]

HEADER = """# Benchmark results

Recorded with the scripts in this folder on the development machine (2 CPU cores,
24 GiB, no GPU) unless a section says otherwise. Each section names the command that
produced it; rerun that command to reproduce. Regenerate this file with
`python benchmarks/collect_results.py` after any benchmark run.
"""


def main() -> None:
    files = {p.stem: p for p in (HERE / "results").glob("*.md")}
    names = [n for n in ORDER if n in files] + sorted(set(files) - set(ORDER))
    sections = [files[n].read_text().strip() for n in names]
    (HERE / "RESULTS.md").write_text(HEADER + "\n" + "\n\n".join(sections) + "\n")
    print(f"wrote {HERE / 'RESULTS.md'} from {', '.join(names)}")


if __name__ == "__main__":
    main()
