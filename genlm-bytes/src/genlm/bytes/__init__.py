"""GenLM bytes: an exact, fast byte-level language model over any token-level ``AsyncLM``.

Public names load lazily (module ``__getattr__``), so the ``genlm`` CLI can import this
package's plugin module without loading numpy or the beam machinery.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from genlm.core import lazy_exports as _lazy_exports

#: Public name -> the private module defining it.
_EXPORTS = {
    "EOS": "_dist",
    "EOT": "_dist",
    "ByteBeamState": "_beam",
    "ByteLM": "_bytelm",
    "ByteLMClosedError": "_model",
    "Candidate": "_types",
    "GeneratedBytes": "_beam",
    "NextByteLogprobs": "_dist",
    "NextTokens": "_types",
    "UnreachableByteError": "_beam",
}

__all__ = [
    "EOS",
    "EOT",
    "ByteBeamState",
    "ByteLM",
    "ByteLMClosedError",
    "Candidate",
    "GeneratedBytes",
    "NextByteLogprobs",
    "NextTokens",
    "UnreachableByteError",
]


__getattr__, __dir__ = _lazy_exports(__name__, "genlm-bytes", _EXPORTS)


if _TYPE_CHECKING:
    from genlm.bytes._beam import ByteBeamState, GeneratedBytes, UnreachableByteError
    from genlm.bytes._bytelm import ByteLM
    from genlm.bytes._dist import EOS, EOT, NextByteLogprobs
    from genlm.bytes._model import ByteLMClosedError
    from genlm.bytes._types import Candidate, NextTokens
