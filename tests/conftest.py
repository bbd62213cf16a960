"""Shared test setup: make ``tests/support`` importable as ``support``."""

import sys
from pathlib import Path

TESTS = Path(__file__).parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

try:
    from hypothesis import settings
except ImportError:  # a session without Hypothesis has no property tests to configure
    pass
else:
    # No per-example deadline: how long an example takes is not what these tests assert
    # (speed targets live in benchmarks/), and on a loaded machine a first example that
    # imports or warms something up overran Hypothesis's 200 ms default (test_faults'
    # batch validation: 449 ms, then 2.5 ms on Hypothesis's own rerun, reported as flaky).
    settings.register_profile("genlm", deadline=None)
    settings.load_profile("genlm")
