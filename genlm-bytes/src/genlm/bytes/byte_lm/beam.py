"""The published genlm-bytes 0.2 module path ``genlm.bytes.byte_lm.beam``."""

from genlm.bytes._beam import ByteBeamState
from genlm.bytes._params import BeamParams

__all__ = ["BeamParams", "ByteBeamState"]
