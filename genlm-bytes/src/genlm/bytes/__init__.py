"""GenLM bytes: an exact, fast byte-level language model over any token-level ``AsyncLM``."""

from importlib.metadata import PackageNotFoundError, version

from genlm.bytes._beam import ByteBeamState, Candidate, GeneratedBytes, UnreachableByteError
from genlm.bytes._bytelm import ByteLM, ByteLMClosedError, NextTokens
from genlm.bytes._dist import EOS, EOT, NextByteLogprobs

try:
    __version__ = version("genlm-bytes")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

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
