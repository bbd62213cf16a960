"""A program using the mlx backend ends with status 0 however its model ends: MLX aborts
the process ("terminate called without an active exception", ml-explore/mlx#3126) when a
thread that ran it ends, or takes the GIL while the interpreter finalizes. Each case runs
in a fresh interpreter, several times: before the fix most runs of each aborted."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CASES = {
    "aclose": (
        "async def main():\n"
        "    lm = load_model_by_name('stories260K', backend='mlx')\n"
        "    await lm.next_token_logprobs([1, 9])\n"
        "    await lm.aclose()\n"
        "asyncio.run(main())\n"
    ),
    "dropped": (
        "lm = load_model_by_name('stories260K', backend='mlx')\n"
        "lm.next_token_logprobs_sync([1, 5])\n"
        "del lm\n"
        "gc.collect()\n"
    ),
    "never closed": (
        "lm = load_model_by_name('stories260K', backend='mlx')\n"
        "lm.next_token_logprobs_sync([1, 5])\n"
    ),
    "computing at exit": (  # a thread's batch still runs when the program ends
        "import threading, time\n"
        "lm = load_model_by_name('stories260K', backend='mlx')\n"
        "lm.next_token_logprobs_sync([1, 5])\n"
        "batch = [[1] + [5] * k for k in range(1, 60)]\n"
        "call = lm.batch_next_token_logprobs_sync\n"
        "threading.Thread(target=call, args=(batch,), daemon=True).start()\n"
        "time.sleep(0.05)\n"
    ),
}
HEAD = "import asyncio, gc\nfrom genlm.core import load_model_by_name\n"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_process_exits_cleanly(case):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    codes = [
        subprocess.run(
            [sys.executable, "-c", HEAD + CASES[case]], env=env, capture_output=True, timeout=120
        ).returncode
        for _ in range(4)
    ]
    assert codes == [0, 0, 0, 0]
