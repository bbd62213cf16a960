"""GenLM bytes: an exact, fast byte-level language model over any token-level ``AsyncLM``.

The model is :class:`ByteLM` and its states (:class:`BeamState`); the published genlm-bytes
0.2 API (``BeamParams``, ``ByteBeamState``, ``LazyTrieState``, ``StatefulTokenizedLM``,
``TrieMode``, the ``genlm.bytes.trie`` classes) is a layer over them, in
``genlm.bytes.byte_lm`` and ``genlm.bytes.trie``, which the model never imports.

Public names load lazily (module ``__getattr__``), so the ``genlm`` CLI can import this
package's plugin module without loading numpy or the beam machinery.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from genlm.core.backend import lazy_exports as _lazy_exports

#: Public name -> the module defining it.
_EXPORTS = {
    "AsyncEosModeTrie": "trie",
    "AsyncTokenByteTrie": "trie",
    "BeamParams": "genlm.bytes.byte_lm.beam",
    "BeamState": "_beam",
    "ByteBeamState": "genlm.bytes.byte_lm.beam",
    "ByteLM": "_bytelm",
    "ByteLMClosedError": "_model",
    "Candidate": "_types",
    "EOS": "_dist",
    "EOT": "_dist",
    "EosModeTrie": "trie",
    "GeneratedBytes": "_beam",
    "LazyTrieState": "genlm.bytes.byte_lm.trie_state",
    "NextByteLogprobs": "_dist",
    "NextTokens": "_types",
    "StatefulTokenizedLM": "genlm.bytes.byte_lm.lm_state",
    "TokenByteTrie": "trie",
    "TrieMode": "genlm.bytes.byte_lm.trie_state",
    "UnreachableByteError": "_beam",
}

__all__ = [
    "AsyncEosModeTrie",
    "AsyncTokenByteTrie",
    "BeamParams",
    "BeamState",
    "ByteBeamState",
    "ByteLM",
    "ByteLMClosedError",
    "Candidate",
    "EOS",
    "EOT",
    "EosModeTrie",
    "GeneratedBytes",
    "LazyTrieState",
    "NextByteLogprobs",
    "NextTokens",
    "StatefulTokenizedLM",
    "TokenByteTrie",
    "TrieMode",
    "UnreachableByteError",
]


__getattr__, __dir__ = _lazy_exports(__name__, "genlm-bytes", _EXPORTS)


if _TYPE_CHECKING:
    from genlm.bytes._beam import BeamState, GeneratedBytes, UnreachableByteError
    from genlm.bytes._bytelm import ByteLM
    from genlm.bytes._dist import EOS, EOT, NextByteLogprobs
    from genlm.bytes._model import ByteLMClosedError
    from genlm.bytes._types import Candidate, NextTokens
    from genlm.bytes.byte_lm.beam import BeamParams, ByteBeamState
    from genlm.bytes.byte_lm.lm_state import StatefulTokenizedLM
    from genlm.bytes.byte_lm.trie_state import LazyTrieState, TrieMode
    from genlm.bytes.trie import AsyncEosModeTrie, AsyncTokenByteTrie, EosModeTrie, TokenByteTrie
