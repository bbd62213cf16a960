"""GenLM bytes: an exact, fast byte-level language model over any token-level ``AsyncLM``.

Public names load lazily (module ``__getattr__``), so the ``genlm`` CLI can import this
package's plugin module without loading numpy or the beam machinery.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

#: Public name -> the private module defining it.
_EXPORTS = {
    "EOS": "_dist",
    "EOT": "_dist",
    "ByteBeamState": "_beam",
    "ByteLM": "_bytelm",
    "ByteLMClosedError": "_bytelm",
    "Candidate": "_beam",
    "GeneratedBytes": "_beam",
    "NextByteLogprobs": "_dist",
    "NextTokens": "_bytelm",
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


def __getattr__(name: str) -> _Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("genlm-bytes")
        except PackageNotFoundError:  # running from a source tree
            return "0+unknown"
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'genlm.bytes' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"genlm.bytes.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | {"__version__"})


if _TYPE_CHECKING:
    from genlm.bytes._beam import ByteBeamState, Candidate, GeneratedBytes, UnreachableByteError
    from genlm.bytes._bytelm import ByteLM, ByteLMClosedError, NextTokens
    from genlm.bytes._dist import EOS, EOT, NextByteLogprobs
