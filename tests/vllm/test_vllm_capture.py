"""The row-capturing logits processor follows vLLM's batch changes by request key."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402

from genlm.backends.vllm._capture import ROW_KEY, RowSink, capture_class  # noqa: E402


def tagged(key):
    return SamplingParams(max_tokens=1, extra_args={ROW_KEY: key})


def batch_logits(owners: list[str], vocab: int = 5) -> torch.Tensor:
    """Logits whose row i is recognisable as belonging to ``owners[i]``."""
    return torch.stack(
        [torch.arange(vocab, dtype=torch.float32) * (ord(k[-1]) % 7 + 1) for k in owners]
    )


def expected_row(key: str, vocab: int = 5) -> torch.Tensor:
    return torch.log_softmax(torch.arange(vocab, dtype=torch.float32) * (ord(key[-1]) % 7 + 1), -1)


def update(size, removed=(), added=(), moved=()):
    return BatchUpdate(batch_size=size, removed=list(removed), added=list(added), moved=list(moved))


def test_rows_follow_adds_removals_moves_and_swaps():
    """After adds, a removal, a move and a swap, each key gets the row at its current index."""
    sink = RowSink()
    proc = capture_class(sink)(None, torch.device("cpu"), False)
    outs = {k: [] for k in "abcd"}
    untagged = SamplingParams(max_tokens=1)
    proc.update_state(
        update(
            4,
            added=[
                (0, tagged("a"), [1], outs["a"]),
                (1, tagged("b"), [1], outs["b"]),
                (2, untagged, [1], []),
                (3, tagged("c"), [1], outs["c"]),
            ],
        )
    )
    # "b" leaves, "c" moves down into its slot, then "a" and "c" swap
    proc.update_state(
        update(
            3,
            removed=[1],
            moved=[(3, 1, MoveDirectionality.UNIDIRECTIONAL), (0, 1, MoveDirectionality.SWAP)],
        )
    )
    proc.update_state(update(4, added=[(3, tagged("d"), [1], outs["d"])]))
    # layout now: 0 -> c, 1 -> a, 2 -> untagged, 3 -> d
    owners = ["c", "a", "x", "d"]
    logits = batch_logits(owners)
    assert proc.apply(logits) is logits
    for key in "acd":
        torch.testing.assert_close(sink.pop(key), expected_row(key))
    assert sink.pop("b") is None and sink.pop("x") is None


def test_only_rows_before_the_first_output_token_are_kept():
    """A chunk row is replaced by the final prefill row, and nothing after a token is accepted."""
    sink = RowSink()
    proc = capture_class(sink)(None, torch.device("cpu"), False)
    out: list[int] = []
    proc.update_state(update(1, added=[(0, tagged("k"), [1, 2, 3], out)]))
    proc.apply(torch.zeros(1, 5))  # a partial-prefill chunk: its sample is discarded
    final = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]])
    proc.apply(final)  # the step that completes the prompt
    out.append(4)  # vLLM accepts the sampled token
    proc.apply(torch.ones(1, 5) * 9)  # any later step must not overwrite the row
    torch.testing.assert_close(sink.pop("k"), torch.log_softmax(final[0], -1))
