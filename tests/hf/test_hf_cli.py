"""The `genlm` command over the hf backend."""

from __future__ import annotations

import os
import subprocess
import sys


def test_no_progress_hides_the_hugging_face_loading_bars():
    """``--no-progress`` hides the loader's bars too (transformers 5's "Loading weights"
    bar was drawn on stderr), as a separate process: the libraries read the setting when
    imported."""
    argv = ["smc", "Once", "--backend", "hf", "--particles", "2", "--max-tokens", "2"]
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    out = subprocess.run(
        [sys.executable, "-m", "genlm.core.cli", *argv, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "%|" not in out.stderr and "it/s]" not in out.stderr, out.stderr
