"""genlm-backend 0.3's documented API on GenLM: ``genlm.backend.llm``, ``.tokenization``, ``.trie``.

A thin facade over genlm-core and the backend plugins (see this distribution's README); torch
is imported with it (the documented API returns torch tensors).
"""

from genlm.backend.llm import load_model_by_name
from genlm.backend.tokenization import Token, decode_vocab

__all__ = ["Token", "decode_vocab", "load_model_by_name"]
