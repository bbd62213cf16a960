"""``genlm.backend.llm.base``, genlm-backend 0.3's documented module of the base class and the mock.

The class lives in :mod:`genlm.backend.llm`; this module is where 0.3's API pages (and
programs written against them) import it from.
"""

from genlm.backend.llm import AsyncLM, MockAsyncLM

__all__ = ["AsyncLM", "MockAsyncLM"]
