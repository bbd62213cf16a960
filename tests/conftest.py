"""Shared test setup: make ``tests/support`` importable as ``support``."""

import sys
from pathlib import Path

TESTS = Path(__file__).parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
