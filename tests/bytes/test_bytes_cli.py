"""``genlm bytes`` through the core CLI, in-process, on the mock backend."""

from __future__ import annotations

from genlm.core.cli import main


def test_cli_shows_the_next_byte_distribution_and_samples(capsys):
    """The plugin command prints top bytes with probabilities and a seeded sample."""
    assert main(["bytes", "Once upon", "--backend", "mock", "--sample", "8", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "after b'Once upon'" in out
    assert "P(token boundary here)" in out
    assert out.strip().splitlines()[-1].startswith("Once upon")
    assert main(["bytes", "Once upon", "--backend", "mock", "--sample", "8", "--seed", "3"]) == 0
    assert capsys.readouterr().out == out
