"""The published genlm-bytes 0.2 API: its module paths and the classes behind them.

This package and ``genlm.bytes.trie`` are the one layer that serves programs written for
genlm-bytes 0.2 (genlm-control 0.4.1's ``ByteLLM``): they import the byte model
(:class:`genlm.bytes.ByteLM`'s beam) and are never imported by it. See
``genlm-bytes/README.md``.
"""

from genlm.bytes.byte_lm.beam import BeamParams, ByteBeamState
from genlm.bytes.byte_lm.lm_state import StatefulTokenizedLM
from genlm.bytes.byte_lm.trie_state import LazyTrieState, TrieMode

__all__ = ["BeamParams", "ByteBeamState", "LazyTrieState", "StatefulTokenizedLM", "TrieMode"]
