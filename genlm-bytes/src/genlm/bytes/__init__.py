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
from genlm.core.backend import type_checking_exports as _type_checking_exports

# The public names, stated once (``X as X`` marks a re-export): read statically by type
# checkers and the API reference, and at import for the lazy ``__getattr__``.
if _TYPE_CHECKING:
    from genlm.bytes._beam import BeamState as BeamState
    from genlm.bytes._beam import GeneratedBytes as GeneratedBytes
    from genlm.bytes._beam import UnreachableByteError as UnreachableByteError
    from genlm.bytes._bytelm import ByteLM as ByteLM
    from genlm.bytes._chart import Chart as Chart
    from genlm.bytes._dist import EOS as EOS
    from genlm.bytes._dist import EOT as EOT
    from genlm.bytes._dist import LazyByteProbs as LazyByteProbs
    from genlm.bytes._dist import NextByteLogprobs as NextByteLogprobs
    from genlm.bytes._model import ByteLMClosedError as ByteLMClosedError
    from genlm.bytes._types import Candidate as Candidate
    from genlm.bytes._types import NextTokens as NextTokens
    from genlm.bytes.byte_lm.beam import BeamParams as BeamParams
    from genlm.bytes.byte_lm.beam import ByteBeamState as ByteBeamState
    from genlm.bytes.byte_lm.lm_state import StatefulTokenizedLM as StatefulTokenizedLM
    from genlm.bytes.byte_lm.trie_state import LazyTrieState as LazyTrieState
    from genlm.bytes.trie import AsyncEosModeTrie as AsyncEosModeTrie
    from genlm.bytes.trie import AsyncTokenByteTrie as AsyncTokenByteTrie
    from genlm.bytes.trie import EosModeTrie as EosModeTrie
    from genlm.bytes.trie import TokenByteTrie as TokenByteTrie
    from genlm.bytes.trie import TrieMode as TrieMode

_EXPORTS = _type_checking_exports(__file__)

__all__ = list(_EXPORTS)

__getattr__, __dir__ = _lazy_exports(__name__, "genlm-bytes", _EXPORTS)
