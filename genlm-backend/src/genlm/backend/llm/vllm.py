"""``genlm.backend.llm.vllm``, genlm-backend 0.3's documented module of the vLLM class.

The class lives in :mod:`genlm.backend.llm`; this module is where 0.3's API pages (and
programs written against them) import it from.
"""

from genlm.backend.llm import AsyncVirtualLM

__all__ = ["AsyncVirtualLM"]
