"""The published genlm-bytes 0.2 module path ``genlm.bytes.byte_lm.trie_state``."""

from genlm.bytes._params import TrieMode
from genlm.bytes._trie_state import LazyTrieState

__all__ = ["LazyTrieState", "TrieMode"]
