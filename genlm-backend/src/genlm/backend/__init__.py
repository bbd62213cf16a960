"""genlm-backend 0.3's documented API on GenLM: ``genlm.backend.llm``, ``.tokenization``, ``.trie``.

A thin facade over genlm-core and the backend plugins (see this distribution's README); torch
is imported with it (the documented API returns torch tensors). The top-level names are
genlm-backend 0.3.1's.
"""

from genlm.backend.llm import AsyncTransformer, AsyncVirtualLM, load_model_by_name
from genlm.backend.tokenization import Token, decode_vocab
from genlm.backend.trie import (
    AsyncTokenCharacterTrie,
    ParallelTokenCharacterTrie,
    TokenCharacterTrie,
)

__all__ = [
    "AsyncTokenCharacterTrie",
    "AsyncTransformer",
    "AsyncVirtualLM",
    "ParallelTokenCharacterTrie",
    "Token",
    "TokenCharacterTrie",
    "decode_vocab",
    "load_model_by_name",
]
