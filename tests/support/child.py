"""``run_program``: run a Python program in a fresh interpreter and see how it ends.

For what only shows at interpreter exit (a worker thread still computing when the program
ends): the exit status and the lines the program printed. Every wait has a limit, so a
program that hangs fails its test instead of hanging the suite.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time

import attrs

#: Run first: a program that aborts (the failure these tests look for) leaves no core file.
NO_CORE_FILE = "import resource; resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"

#: Longest a program may run (a model load and a forward pass on a loaded CI machine).
TIMEOUT_S = 180.0


@attrs.frozen
class Ended:
    """How a program ended: ``returncode`` (negative: killed by that signal, as
    ``subprocess`` reports it), its stdout ``lines`` and its ``stderr``."""

    returncode: int
    lines: list[str]
    stderr: str


def run_program(
    program: str, *, interrupt_after: str | None = None, timeout_s: float = TIMEOUT_S
) -> Ended:
    """Run ``program`` with this interpreter and its ``sys.path`` (no core file); with
    ``interrupt_after``, send it SIGINT (a Ctrl-C) once it has printed that line.

    Raises:
        subprocess.TimeoutExpired: the program ran longer than ``timeout_s`` (it is killed).
        AssertionError: it ended, or ran out of time, without printing ``interrupt_after``.
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    program = NO_CORE_FILE + program
    deadline = time.monotonic() + timeout_s
    # stderr goes to a file: a pipe nobody reads before the interrupt could fill and block.
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=stderr, env=env
        )
        try:
            seen = b""
            if interrupt_after is not None:
                seen = _read_until(proc, interrupt_after.encode(), deadline)
                proc.send_signal(signal.SIGINT)
            rest, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stderr.seek(0)
        return Ended(proc.returncode, (seen + rest).decode().splitlines(), stderr.read().decode())


def _read_until(proc: subprocess.Popen, line: bytes, deadline: float) -> bytes:
    """What ``proc`` printed up to and including ``line`` (raw reads: nothing is left in a
    file object's buffer for ``communicate``)."""
    fd = proc.stdout.fileno()
    seen = b""
    while line not in seen.splitlines():
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:  # the deadline passed, or the program ended without the line
            raise AssertionError(f"the program never printed {line!r}; it printed {seen!r}")
        seen += chunk
    return seen
