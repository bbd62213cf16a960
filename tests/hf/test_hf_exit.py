"""A program that ends while an hf model computes a batch exits with its own status.

Before the fix the worker, a daemon thread, was left inside torch's C++ code while the
interpreter finalized, and the process aborted when it came back ("terminate called
without an active exception", SIGABRT, status 134) instead of exiting with 3, 1 or the
Ctrl-C's SIGINT. Each program runs in a fresh interpreter, with a timeout; its batch
starts its forward pass only once the program has ended (an exit handler registered
after the worker's start runs before the worker's own exit stop), so that the forward
is inside torch while the interpreter would finalize.
"""

from __future__ import annotations

import signal

import pytest
from support.child import run_program

HEAD = """
import asyncio, atexit, signal, threading
from genlm.backends.hf import HFLM
signal.signal(signal.SIGINT, signal.default_int_handler)
exiting, started = threading.Event(), threading.Event()

class AtExit(HFLM):
    def _logprobs_batch(self, contexts, variant):
        atexit.register(exiting.set)  # before the line the parent interrupts after
        print('batch of', len(contexts), flush=True)
        started.set()
        exiting.wait(60)
        rows = super()._logprobs_batch(contexts, variant)
        print('batch done', flush=True)
        return rows

lm = AtExit.from_name('stories260K', max_batch_size=2)
contexts = [[1] + [100 + (k * 7 + j) % 300 for j in range(300)] for k in range(4)]
"""

#: How the program ends while the first batch (of two) computes: its code, the exit
#: status that must show it, and the line after which it gets a Ctrl-C (SIGINT), if any.
ENDINGS = {
    "SystemExit": (
        "async def main():\n"
        "    batches = asyncio.ensure_future(lm.batch_next_token_logprobs(contexts))\n"
        "    await asyncio.to_thread(started.wait, 60)\n"
        "    raise SystemExit(3)\n"
        "asyncio.run(main())\n",
        3,
        None,
    ),
    "error in asyncio.run": (
        "async def particle(i):\n"
        "    if i == 2:\n"
        "        await asyncio.to_thread(started.wait, 60)\n"
        "        raise ValueError('a bug in the program')\n"
        "    return await lm.batch_next_token_logprobs(contexts[2 * i : 2 * i + 2])\n"
        "async def main():\n"
        "    await asyncio.gather(*(particle(i) for i in range(3)))\n"
        "asyncio.run(main())\n",
        1,
        None,
    ),
    "ctrl-c": ("lm.batch_next_token_logprobs_sync(contexts)\n", -signal.SIGINT, "batch of 2"),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_the_program_exits_with_its_own_status(ending):
    """The running batch finishes, the one behind it does not run (queued on the worker,
    or never handed over), and the exit status is the program's."""
    code, status, interrupt_after = ENDINGS[ending]
    ended = run_program(HEAD + code, interrupt_after=interrupt_after)
    assert ended.returncode == status, ended.stderr[-2000:]
    assert ended.lines == ["batch of 2", "batch done"]
