"""The published genlm-bytes 0.2 module path ``genlm.bytes.byte_lm`` (names re-exported).

The implementation is :class:`genlm.bytes.ByteLM`'s; see ``genlm-bytes/README.md``.
"""

from genlm.bytes._beam import ByteBeamState
from genlm.bytes._lm_state import StatefulTokenizedLM
from genlm.bytes._params import BeamParams, TrieMode
from genlm.bytes._trie_state import LazyTrieState

__all__ = ["BeamParams", "ByteBeamState", "LazyTrieState", "StatefulTokenizedLM", "TrieMode"]
