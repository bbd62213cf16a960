"""Argument types that reject bad values while parsing, before any model loads."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite float > 0."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def positive_temperature(text: str) -> float:
    """A temperature > 0 whose reciprocal is finite, so sampling accepts it."""
    from genlm.core._sampling import MIN_TEMPERATURE

    value = positive_float(text)
    if value < MIN_TEMPERATURE:
        raise argparse.ArgumentTypeError(
            f"must be at least {MIN_TEMPERATURE:.4g} (1/temperature overflows below), got {text}"
        )
    return value


def fraction(text: str) -> float:
    """A float in [0, 1]."""
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def ascii_bytes(text: str) -> bytes:
    """Non-empty ASCII characters, as bytes.

    Only single bytes can be forbidden exactly by masking tokens: a multi-byte character
    can be split across two tokens.
    """
    if not text:
        raise argparse.ArgumentTypeError("needs at least one character")
    if not text.isascii():
        raise argparse.ArgumentTypeError(
            f"takes ASCII characters only, got {text!r} (a multi-byte character can be "
            "split across two tokens, so masking tokens cannot forbid it exactly)"
        )
    return text.encode("ascii")
