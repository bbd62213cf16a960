"""genlm-backend-vllm's wheel, without its 3 GB engine: discovered, and says what is missing."""

from __future__ import annotations

import json

from _smoke import assert_installed, run_genlm, start


def main() -> None:
    start("genlm-backend-vllm")
    import genlm.backends.vllm.plugin

    assert_installed(genlm.backends.vllm.plugin)
    report = json.loads(run_genlm("backends", "--json"))
    [row] = [r for r in report["backends"] if r["name"] == "vllm"]
    assert row["distribution"] == "genlm-backend-vllm" and row["version"] != "?", row
    assert not row["available"] and "vllm is not installed" in row["status"], row


if __name__ == "__main__":
    main()
