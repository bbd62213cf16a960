"""``genlm.backend.llm.hf``, genlm-backend 0.3's documented module of the Hugging Face class.

The class lives in :mod:`genlm.backend.llm`; this module is where 0.3's API pages (and
programs written against them) import it from.
"""

from genlm.backend.llm import AsyncTransformer

__all__ = ["AsyncTransformer"]
