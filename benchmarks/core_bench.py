"""Core benchmarks: SMC step and per-request overhead, import time, `genlm backends` time.

Step overhead: an SMC-like step, ``asyncio.gather`` of one ``next_token_logprobs`` per
particle (each particle a distinct, growing context after a 64-token prompt), on a backend
that returns precomputed rows, with the default options (output cache on, batches of 32).
What a step costs is what GenLM adds around a forward pass that takes no time:
validation, cache lookups, batching, the thread hop, the row checks and views (rows are
views of their batch, never copied: at a 128k vocabulary a copy per row cost more than the
rest) and fan-out. Best of several runs (the machine may be shared).

Bound: the gathered step's work with no scheduler (``unscheduled``), and both steps with
the row checks or the cache store left out, show what each part costs and what the
scheduler itself adds.

Thread placement: the same steps in a child process pinned to one CPU, and a bare
loop-worker round trip (a ``SimpleQueue`` there, ``call_soon_threadsafe`` back, as
``ModelWorker.run_then`` does) free and pinned. The event loop and the worker take turns
(the GIL), so each hand-over wakes the other thread; on a VM a wake-up of a thread whose
CPU has gone idle is slow, on the same CPU it is a context switch. How slow depends on how
the machine idles its CPUs (a KVM guest's halt polling, for one), which the results record.

Request overhead: 10,000 concurrent requests over 256 distinct contexts through the mock
backend; the backend's own compute time (measured inside the worker) is subtracted,
so what remains is what GenLM adds per request: validation, cache lookups, batching,
dedup, the thread hop and result fan-out (and asyncio's own task cost).

Instructions (``--instructions``, needs valgrind): the CPU instructions of one step at the
512-token vocabulary, counted by callgrind (a 30-step run less a 10-step run, so start-up
cancels out). Unlike wall time it does not move with the load on a shared VM, so it shows
what a change to the per-request path saves; it leaves out the threads' wake-up latency.

Usage: python benchmarks/core_bench.py [--repeats 5] [--instructions]
[--out benchmarks/results/core.md]

The tables at the top of ``--out`` are rewritten; the notes of earlier rounds below them
(from the first ``###`` heading on) are kept.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import itertools
import json
import os
import platform
import queue
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
from _common import write_results

from genlm.core import Vocabulary
from genlm.core.backend import BatchedLM, Request
from genlm.core.mock import MockLM

N_REQUESTS = 10_000
N_CONTEXTS = 256
PROMPT_TOKENS = 64
PARTICLES = (1, 16, 64, 256)
VOCAB_SIZES = (512, 128 * 1024)


class PrecomputedLM(BatchedLM):
    """Returns slices of one precomputed batch of uniform rows: a forward pass of no cost.

    It never writes to its rows, so core keeps the batches it returns without a copy
    (``stable_batches``), as it does a real backend's fresh output.
    """

    stable_batches = True

    def __init__(self, vocab_size: int, max_rows: int):
        tokens = tuple(i.to_bytes(3, "little") for i in range(vocab_size))
        super().__init__(Vocabulary(tokens), name="precomputed")
        self.rows = np.full((max_rows, vocab_size), -np.log(vocab_size), dtype=np.float32)

    def _logprobs_batch(self, contexts, variant):
        return self.rows[: len(contexts)]


class PartsLM(PrecomputedLM):
    """A :class:`PrecomputedLM` that can skip parts of a step's work, for
    :func:`bound_overhead`: ``rows=False``, the row checks (the rows handed out are plain
    views of the precomputed ones); ``store=False``, the output cache's store."""

    def __init__(self, vocab_size: int, max_rows: int, rows: bool = True, store: bool = True):
        super().__init__(vocab_size, max_rows)
        self.row_work = rows
        if not store:
            self.batcher._on_results = None  # the scheduler's store of each batch's rows
            self.output_cache.put_many = lambda keys, rows: rows  # the unscheduled step's

    def _run_requests(self, requests):
        if self.row_work:
            return super()._run_requests(requests)
        return list(self.rows[: len(requests)])


async def gathered(lm: BatchedLM, contexts: list[list[int]]) -> list[np.ndarray]:
    """One task per context, each awaiting ``next_token_logprobs`` (llamppl's and
    ``genlm.core.smc``'s step)."""
    return await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))


async def batched(lm: BatchedLM, contexts: list[list[int]]) -> np.ndarray:
    """One ``batch_next_token_logprobs`` call."""
    return await lm.batch_next_token_logprobs(contexts)


async def unscheduled(lm: BatchedLM, contexts: list[list[int]]) -> list[np.ndarray]:
    """A gathered step's work with no scheduler: the bound the scheduler is measured against.

    Each task validates its context and looks it up in the output cache, as
    ``next_token_logprobs`` does, then awaits a future of its own. The first task schedules
    one flush (``call_soon``) that hands batches of ``max_batch_size`` to the worker with the
    model's own batch function (backend, row checks, row copies); a batch's end stores its
    rows in the cache and resolves its futures. Left out is what the scheduler adds: dedup,
    groups, backpressure, cancellation, timers, firing a full batch early.
    """
    loop = asyncio.get_running_loop()
    queued: list[tuple[Request, asyncio.Future]] = []

    def finish(batch, rows, exc) -> None:
        if exc is None:
            lm.output_cache.put_many([request for request, _ in batch], rows)
        for i, (_, future) in enumerate(batch):
            if exc is None:
                future.set_result(rows[i])
            else:
                future.set_exception(exc)

    def flush() -> None:
        size = lm.batcher.max_batch_size
        for start in range(0, len(queued), size):
            batch = queued[start : start + size]
            requests = [request for request, _ in batch]
            lm.worker.run_then(loop, lm._run_requests, (requests,), partial(finish, batch))

    async def one(ids: list[int]) -> np.ndarray:
        request = lm.validate_request(ids)
        row = lm.output_cache.get(request)
        if row is None:
            queued.append((request, future := asyncio.Future(loop=loop)))
            if len(queued) == 1:
                loop.call_soon(flush)
            row = await future
        return row

    return await asyncio.gather(*(one(c) for c in contexts))


#: The ways a step asks, by the names the tables use.
CALLS = {"gather": gathered, "batch": batched, "unscheduled": unscheduled}


async def smc_steps(lm: BatchedLM, n_particles: int, steps: int, call: str = "gather") -> float:
    """Seconds per step of ``steps`` SMC-like steps of ``n_particles`` distinct contexts,
    each step asked by :data:`CALLS` ``[call]``."""
    ask = CALLS[call]
    prompt = list(range(1, PROMPT_TOKENS + 1))
    particles: list[list[int]] = [[] for _ in range(n_particles)]
    start = time.perf_counter()
    for _ in range(steps):
        await ask(lm, [prompt + p for p in particles])
        for i, particle in enumerate(particles):
            particle.append(i % len(lm.vocab))
    return (time.perf_counter() - start) / steps


def step_overhead(repeats: int = 5) -> dict[tuple[int, str, int], float]:
    """Best milliseconds per step for each (vocabulary size, call, particles)."""
    results = {}
    for vocab_size in VOCAB_SIZES:
        lm = PrecomputedLM(vocab_size, max(PARTICLES))
        for call in CALLS:
            if call == "unscheduled" and vocab_size > 4096:
                continue  # the bound is the scheduler's; at 128k the rows' work dominates
            for n_particles in PARTICLES:
                steps = max(4, min(64, 2048 // n_particles))
                if vocab_size > 4096:
                    steps = max(2, steps // 8)
                runs = []
                for _ in range(repeats + 1):  # the first run warms up
                    lm.output_cache.clear()  # every run's contexts are new to the cache
                    runs.append(asyncio.run(smc_steps(lm, n_particles, steps, call)))
                results[vocab_size, call, n_particles] = min(runs[1:]) * 1000
        lm.close()
    return results


async def asyncio_floor(n_particles: int, steps: int) -> float:
    """Seconds per step of asyncio's own part of a gathered step: one task per particle
    awaiting a future, all resolved together (what any per-call API costs at least)."""
    loop = asyncio.get_running_loop()

    async def one(futures: list[asyncio.Future]) -> None:
        if not futures:  # the first task: resolve after every task's first step, as the
            loop.call_soon(resolve, futures)  # scheduler's flush runs
        futures.append(loop.create_future())
        await futures[-1]

    def resolve(futures: list[asyncio.Future]) -> None:
        for future in futures:
            future.set_result(None)

    start = time.perf_counter()
    for _ in range(steps):
        futures: list[asyncio.Future] = []
        await asyncio.gather(*(one(futures) for _ in range(n_particles)))
    return (time.perf_counter() - start) / steps


def floor_overhead(repeats: int = 5) -> dict[int, float]:
    """Best milliseconds per step of :func:`asyncio_floor` for each particle count."""
    return {
        p: min(asyncio.run(asyncio_floor(p, max(8, 2048 // p))) for _ in range(repeats + 1)) * 1000
        for p in PARTICLES
    }


#: The particle counts of :func:`bound_overhead` (those of the targets).
BOUND_PARTICLES = (16, 64)

#: The parts of a step :func:`bound_overhead` takes out, by the names its table uses.
BOUND_PARTS = {
    "all of it": {},
    "no row checks": {"rows": False},
    "no cache store": {"store": False},
    "neither": {"rows": False, "store": False},
}


def bound_overhead(repeats: int = 5) -> dict[tuple[str, int, str], float]:
    """Best milliseconds per step at the 512-token vocabulary, for each (call, particles,
    part left out) of ``gather`` and ``unscheduled`` at P=16 and 64 and :data:`BOUND_PARTS`
    (runs alternate, so a change in the machine's load touches every cell alike)."""
    models = {name: PartsLM(512, 64, **parts) for name, parts in BOUND_PARTS.items()}
    best: dict[tuple[str, int, str], float] = {}
    for run in range(repeats + 1):  # the first run warms up
        for call, n_particles, (name, lm) in itertools.product(
            ("gather", "unscheduled"), BOUND_PARTICLES, models.items()
        ):
            lm.output_cache.clear()
            steps = max(8, 2048 // n_particles)
            ms = asyncio.run(smc_steps(lm, n_particles, steps, call)) * 1000
            if run:
                key = call, n_particles, name
                best[key] = min(best.get(key, ms), ms)
    for lm in models.values():
        lm.close()
    return best


#: The steps measured again on one CPU: (call, particles) at the 512-token vocabulary.
PINNED_STEPS = [(c, p) for c in ("gather", "batch", "unscheduled") for p in (16, 64)]


def round_trip_us(n: int = 2000) -> float:
    """Median microseconds of a bare loop-worker round trip: a call handed to a thread
    through a ``SimpleQueue`` and answered with ``call_soon_threadsafe``, as
    ``ModelWorker.run_then`` does, with nothing computed in between."""

    async def run() -> float:
        loop = asyncio.get_running_loop()
        calls: queue.SimpleQueue = queue.SimpleQueue()

        def worker() -> None:
            while (future := calls.get()) is not None:
                loop.call_soon_threadsafe(future.set_result, None)

        thread = threading.Thread(target=worker)
        thread.start()
        times = []
        for _ in range(n):
            future = loop.create_future()
            start = time.perf_counter()
            calls.put(future)
            await future
            times.append(time.perf_counter() - start)
        calls.put(None)
        thread.join()
        return statistics.median(times) * 1e6

    return asyncio.run(run())


def placement(repeats: int = 5) -> dict[str, float]:
    """The round trip here, and it and :data:`PINNED_STEPS` in a child process pinned to
    one CPU (``--pinned``); keys ``"round trip"``, ``"pinned round trip"`` and
    ``"pinned CALL P"``."""
    cmd = [sys.executable, __file__, "--pinned", str(repeats)]
    child = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return {"round trip": round_trip_us(), **json.loads(child.stdout)}


def pinned_child(repeats: int) -> None:
    """What ``--pinned`` runs: pin this process to one CPU (its threads inherit it), then
    print the round trip and :data:`PINNED_STEPS` as JSON."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    lm = PrecomputedLM(512, 64)
    results = {"pinned round trip": round_trip_us()}
    for call, n_particles in PINNED_STEPS:
        runs = []
        for _ in range(repeats + 1):  # the first run warms up
            lm.output_cache.clear()
            runs.append(asyncio.run(smc_steps(lm, n_particles, max(8, 2048 // n_particles), call)))
        results[f"pinned {call} {n_particles}"] = min(runs[1:]) * 1000
    lm.close()
    print(json.dumps(results))


class TimedMock(MockLM):
    """A mock with cheap rows, timing its own backend work."""

    backend_s = 0.0

    def _logprobs_batch(self, contexts, variant):
        start = time.perf_counter()
        out = super()._logprobs_batch(contexts, variant)
        TimedMock.backend_s += time.perf_counter() - start
        return out


async def one_round(lm: MockLM) -> float:
    contexts = [[1, i % 256, i // 256] for i in range(N_CONTEXTS)]
    start = time.perf_counter()
    await asyncio.gather(
        *(lm.next_token_logprobs(contexts[i % N_CONTEXTS]) for i in range(N_REQUESTS))
    )
    return time.perf_counter() - start


def scheduler_overhead(repeats: int = 5) -> dict[str, float]:
    results = []
    for cached in (False, True):
        per_request = []
        for _ in range(repeats):
            lm = TimedMock([bytes([b]) for b in range(256)], max_batch_size=256)
            if not cached:
                lm.output_cache.max_bytes = 0
            else:
                asyncio.run(one_round(lm))  # warm the output cache
            TimedMock.backend_s = 0.0
            wall = asyncio.run(one_round(lm))
            per_request.append((wall - TimedMock.backend_s) / N_REQUESTS * 1e6)
            lm.close()
        results.append(statistics.median(per_request))
    return {"uncached_us": results[0], "cached_us": results[1]}


#: The steps ``--instructions`` counts: (label, call, particles); ``floor`` is asyncio's.
COUNTED = [(c, p) for c in ("gather", "unscheduled", "batch", "floor") for p in (16, 64)]


def one_run(call: str, n_particles: int, steps: int) -> None:
    """What callgrind runs: a warm-up, then ``steps`` steps of ``call`` (512 tokens)."""
    lm = PrecomputedLM(512, n_particles)
    for n in (4, steps):
        lm.output_cache.clear()
        if call == "floor":
            asyncio.run(asyncio_floor(n_particles, n))
        else:
            asyncio.run(smc_steps(lm, n_particles, n, call))
    lm.close()


def instructions_per_step() -> dict[tuple[str, int], float] | None:
    """CPU instructions of one step for each of :data:`COUNTED`; None without valgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # idle BLAS threads would spin in it
    results = {}
    for call, n_particles in COUNTED:
        counts = []
        for steps in (10, 30):
            cmd = [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null"]
            cmd += [sys.executable, __file__, "--one-run", call, str(n_particles), str(steps)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            counts.append(int(re.search(r"Collected : (\d+)", out.stderr).group(1)))
        results[call, n_particles] = (counts[1] - counts[0]) / 20
    return results


def cpu_idle() -> str:
    """How this machine's idle CPUs wait (Linux sysfs): the cpuidle driver and governor,
    and a KVM guest's halt-polling window where the haltpoll driver has one.

    Every free-thread number here moves with it: waking a thread whose CPU has halted costs
    tens of µs on a VM (the halt leaves the guest), while a CPU still polling wakes at once.
    """

    def read(path: str) -> str | None:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return None

    root = "/sys/devices/system/cpu/cpuidle"
    driver = read(f"{root}/current_driver")
    if driver is None:
        return "not known (no cpuidle in sysfs)"
    governor = read(f"{root}/current_governor_ro") or read(f"{root}/current_governor")
    text = f"cpuidle driver {driver}, governor {governor}"
    if driver != "haltpoll":
        # The haltpoll module's window may be set while another driver idles the CPUs:
        # it then polls nothing. Without a driver an idle CPU halts at once (a VM's host
        # may still poll before it deschedules the vCPU; the guest cannot see that).
        return text + ", no guest halt polling"
    poll_ns = read("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
    if poll_ns is not None and poll_ns.isdigit():
        text += f", guest halt polling up to {int(poll_ns):,} ns"
    return text


def wall_time(cmd: list[str], repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "core.md")
    parser.add_argument("--repeats", type=int, default=5, help="runs per step measure")
    parser.add_argument(
        "--instructions", action="store_true", help="also count instructions per step (valgrind)"
    )
    parser.add_argument(  # what --instructions runs under valgrind
        "--one-run", nargs=3, metavar=("CALL", "P", "STEPS"), help=argparse.SUPPRESS
    )
    parser.add_argument(  # what placement() runs in its child
        "--pinned", type=int, metavar="REPEATS", help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.pinned is not None:
        pinned_child(args.pinned)
        return
    if args.one_run:
        call, n_particles, n_steps = args.one_run
        one_run(call, int(n_particles), int(n_steps))
        return
    counted = instructions_per_step() if args.instructions else None
    steps = step_overhead(args.repeats)
    floor = floor_overhead(args.repeats)
    bound = bound_overhead(args.repeats)
    placed = placement(args.repeats)
    overhead = scheduler_overhead()
    baseline = wall_time([sys.executable, "-c", "pass"])
    import_ms = wall_time([sys.executable, "-c", "import genlm.core"])
    backends_ms = wall_time([sys.executable, "-m", "genlm.core.cli", "backends"])
    n_dists = len(list(importlib.metadata.distributions()))
    lines = [
        "## Core: scheduler overhead and start-up",
        "",
        f"Machine: {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}; medians. Command: `python benchmarks/core_bench.py`.",
        "",
        f"CPU idle: {cpu_idle()} (a thread woken on a halted CPU of a VM waits tens of µs).",
        "",
        f"SMC-like step, {PROMPT_TOKENS}-token prompt, default options, backend returning "
        f"precomputed rows; best of {args.repeats} runs, ms per step:",
        "",
        "| vocabulary | call | " + " | ".join(f"P={p}" for p in PARTICLES) + " |",
        "| --- | --- |" + " --- |" * len(PARTICLES),
        *(
            f"| {v:,} | {call} | "
            + " | ".join(f"{steps[v, call, p]:.3f}" for p in PARTICLES)
            + " |"
            for v in VOCAB_SIZES
            for call in CALLS
            if (v, call, PARTICLES[0]) in steps
        ),
        "| | asyncio's floor | " + " | ".join(f"{floor[p]:.3f}" for p in PARTICLES) + " |",
        "",
        "`gather`: one `next_token_logprobs` task per particle (what `genlm.core.smc` makes); "
        "`batch`: one `batch_next_token_logprobs` call; `unscheduled`: the gathered step's "
        "work (validation, cache lookups and stores, a future per task, the worker hand-off, "
        "row checks and views) with no scheduler, a bound for it (the `gather` row less this "
        "one is what dedup, groups, backpressure and cancellation cost); asyncio's floor: "
        "a gather of one task per particle, each awaiting a future resolved together, "
        "with no model at all (the least any per-call step costs). Targets at the "
        "512-token vocabulary, with nothing else running: P=16 <= 0.3 ms, P=64 <= 0.6 ms. "
        "At 128k the row checks on the worker thread (a maximum over every row) dominate.",
        "",
        "Where a gathered step's time goes: `gather` and `unscheduled` at the 512-token "
        "vocabulary with parts of the work left out (a `PrecomputedLM` whose batches skip "
        "the row checks, handing out plain views of its rows, or whose rows are not "
        f"stored in the output cache); best of {args.repeats} alternating runs, ms per step:",
        "",
        "| call | P | " + " | ".join(BOUND_PARTS) + " |",
        "| --- | --- |" + " --- |" * len(BOUND_PARTS),
        *(
            f"| {call} | {p} | "
            + " | ".join(f"{bound[call, p, name]:.3f}" for name in BOUND_PARTS)
            + " |"
            for call in ("gather", "unscheduled")
            for p in BOUND_PARTICLES
        ),
        "",
        "`unscheduled` with neither part is what is left with no scheduler, row work or cache "
        "store: validation, the cache lookup, asyncio's tasks and futures, the worker hand-off.",
        "",
        "Thread placement: the 512-token steps again in a process pinned to one CPU, where "
        "every hand-over between the event loop and the worker is a context switch; free, "
        "the worker often runs on the other CPU and each hand-over wakes a thread whose CPU "
        f"went idle. Best of {args.repeats} runs, ms per step:",
        "",
        "| call | P=16 free | P=16 one CPU | P=64 free | P=64 one CPU |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {call} | "
            + " | ".join(
                f"{steps[512, call, p]:.3f} | {placed[f'pinned {call} {p}']:.3f}" for p in (16, 64)
            )
            + " |"
            for call in ("gather", "batch", "unscheduled")
        ),
        "",
        f"A bare loop-worker round trip (median): {placed['round trip']:.1f} µs free, "
        f"{placed['pinned round trip']:.1f} µs on one CPU.",
        "",
        *(
            [
                "CPU instructions per step at the 512-token vocabulary (callgrind; "
                "`--instructions`): "
                + "; ".join(f"{call} P={p}: {counted[call, p] / 1e6:.2f} M" for call, p in COUNTED)
                + ". They do not vary with the load; the threads' wake-ups are not in them.",
                "",
            ]
            if counted
            else []
        ),
        "| measure | result | target |",
        "| --- | --- | --- |",
        f"| overhead per request, {N_REQUESTS:,} concurrent requests over {N_CONTEXTS} contexts, "
        f"cold cache | {overhead['uncached_us']:.1f} µs | < 30 µs |",
        f"| the same, every context already in the output cache | "
        f"{overhead['cached_us']:.1f} µs | |",
        f"| `python -c 'import genlm.core'` wall time | {import_ms:.0f} ms "
        f"(bare interpreter {baseline:.0f} ms) | < 150 ms |",
        f"| `genlm backends` wall time | {backends_ms:.0f} ms | < 150 ms |",
        "",
        f"Measured in an environment with {n_dists} installed distributions (load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs). `genlm backends` must import "
        "`importlib.metadata` (about 50 ms: it pulls in the `email` package) and read the entry "
        "points of every installed distribution, then import each plugin module and probe it; "
        "that, plus the bare interpreter, is its floor. Plugin modules import no numpy.",
        "",
    ]
    write_results(args.out, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
