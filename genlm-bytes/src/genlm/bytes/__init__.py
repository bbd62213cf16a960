"""GenLM bytes: an exact, fast byte-level language model over any token-level ``AsyncLM``.

Public names load lazily (module ``__getattr__``), so the ``genlm`` CLI can import this
package's plugin module without loading numpy or the beam machinery.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from genlm.core.backend import lazy_exports as _lazy_exports

#: Public name -> the private module defining it.
_EXPORTS = {
    "AsyncTokenByteTrie": "trie",
    "EOS": "_dist",
    "EOT": "_dist",
    "BeamParams": "_params",
    "ByteBeamState": "_beam",
    "ByteLM": "_bytelm",
    "ByteLMClosedError": "_model",
    "Candidate": "_types",
    "GeneratedBytes": "_beam",
    "LazyTrieState": "_trie_state",
    "NextByteLogprobs": "_dist",
    "NextTokens": "_types",
    "StatefulTokenizedLM": "_lm_state",
    "TokenByteTrie": "trie",
    "TrieMode": "_params",
    "UnreachableByteError": "_beam",
    "core_lm_of": "_lm_state",
}

__all__ = [
    "AsyncTokenByteTrie",
    "EOS",
    "EOT",
    "BeamParams",
    "ByteBeamState",
    "ByteLM",
    "ByteLMClosedError",
    "Candidate",
    "GeneratedBytes",
    "LazyTrieState",
    "NextByteLogprobs",
    "NextTokens",
    "StatefulTokenizedLM",
    "TokenByteTrie",
    "TrieMode",
    "UnreachableByteError",
    "core_lm_of",
]


__getattr__, __dir__ = _lazy_exports(__name__, "genlm-bytes", _EXPORTS)


if _TYPE_CHECKING:
    from genlm.bytes._beam import ByteBeamState, GeneratedBytes, UnreachableByteError
    from genlm.bytes._bytelm import ByteLM
    from genlm.bytes._dist import EOS, EOT, NextByteLogprobs
    from genlm.bytes._lm_state import StatefulTokenizedLM, core_lm_of
    from genlm.bytes._model import ByteLMClosedError
    from genlm.bytes._params import BeamParams, TrieMode
    from genlm.bytes._trie_state import LazyTrieState
    from genlm.bytes._types import Candidate, NextTokens
    from genlm.bytes.trie import AsyncTokenByteTrie, TokenByteTrie
