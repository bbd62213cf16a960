"""The published genlm-bytes 0.2 module path ``genlm.bytes.byte_lm.lm_state``."""

from genlm.bytes._lm_state import StatefulTokenizedLM

__all__ = ["StatefulTokenizedLM"]
