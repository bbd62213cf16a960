"""Row planning for backends that keep KV between batches (torch-free; hf and mlx use it).

A backend that keeps key/value state has two places to resume a context from: the rows its
last batch left in place (*resident* rows: hf's kept batch buffer, mlx's live batch), and
compact copies of earlier contexts in a :class:`~genlm.core.backend.PrefixCache`. For each context
of a new batch this module decides where its past comes from:

- *extend resident row s by k new tokens* (:meth:`ResidentRows.row`,
  :meth:`ResidentRows.extend_all`, :meth:`ResidentRows.holds`),
- *resume from a cached prefix of p tokens* (:func:`plan_rows`, ``p >= 1``),
- *start fresh* (:func:`plan_rows`, ``p == 0``),

and which rows share a forward pass (:func:`group_equal`, :func:`group_padded`). The
decisions only look at token ids; moving tensors stays with each backend. The last token
of a context always runs, as its logits are the answer, so a past is at most
``len(context) - 1`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import attrs

V = TypeVar("V")

#: A context: token ids.
Context = tuple[int, ...]


@attrs.frozen(eq=False)
class RowPlan(Generic[V]):
    """Where one context's past comes from, and what is left to run.

    Row ``index`` of the batch resumes ``context[:past]`` (0: starts fresh) from
    ``cached``, what the backend's lookup returned for that prefix (its stored KV).
    """

    index: int
    context: Context
    past: int
    cached: V | None = None

    @property
    def new(self) -> int:
        """Tokens the forward pass must run for this row (at least 1)."""
        return len(self.context) - self.past


def plan_rows(
    contexts: Sequence[Context], lookup: Callable[[Context, int], tuple[int, V | None]]
) -> list[RowPlan[V]]:
    """One :class:`RowPlan` per context, in order, resuming from its longest cached proper prefix.

    ``lookup(context, limit)`` returns ``(length, cached)``: the longest prefix of
    ``context`` of at most ``limit`` tokens whose KV is kept (``(0, ...)`` when none), and
    the backend's value for it.
    """
    rows = []
    for index, context in enumerate(contexts):
        past, cached = lookup(context, len(context) - 1)
        rows.append(RowPlan(index, context, past, cached))
    return rows


class ResidentRows:
    """The contexts whose KV the last batch left in place, one per row of its buffers.

    ``contexts[i]`` is row ``i``'s context, or None where row ``i`` cannot be resumed (hf:
    its past and new tokens are not contiguous in the buffer).
    """

    def __init__(self, contexts: Sequence[Context | None]):
        self.contexts = list(contexts)
        # A context held by two rows maps to the later one (either would do).
        self._rows = {c: i for i, c in enumerate(self.contexts) if c is not None}
        self._lengths = sorted({len(c) for c in self._rows}, reverse=True)

    def __len__(self) -> int:
        return len(self.contexts)

    def row(self, tokens: Sequence[int], max_length: int) -> int | None:
        """The row holding the longest ``tokens[:n]`` with ``n <= max_length``, or None."""
        for length in self._lengths:
            if length <= max_length:
                row = self._rows.get(tuple(tokens[:length]))
                if row is not None:
                    return row
        return None

    def holds(self, i: int, context: Sequence[int], past: int) -> bool:
        """Whether row ``i`` holds exactly ``context[:past]`` (no row past the last does)."""
        held = self.contexts[i] if i < len(self.contexts) else None
        return held is not None and len(held) == past and tuple(context[:past]) == held

    def extend_all(self, contexts: Sequence[Context]) -> tuple[list[int], int] | None:
        """``(sources, new)`` when every context is row ``sources[i]`` plus ``new >= 1`` tokens.

        The row holding a context's longest proper prefix is its source; no contexts give
        ``([], 0)``. None when some context extends no row, or when contexts add different
        numbers of tokens (rows that advance in place advance together).
        """
        sources, new = [], 0
        for context in contexts:
            row = self.row(context, len(context) - 1)
            if row is None:
                return None
            added = len(context) - len(self.contexts[row])
            if new and added != new:
                return None
            sources.append(row)
            new = added
        return sources, new


def group_equal(news: Sequence[int]) -> list[list[int]]:
    """Indices into ``news`` grouped by equal new-token count, groups in first-seen order.

    For backends whose rows of one forward must add the same number of tokens (no padding
    of new tokens, e.g. mlx's ``BatchKVCache``). Each group is in increasing order.
    """
    groups: dict[int, list[int]] = {}
    for i, new in enumerate(news):
        groups.setdefault(new, []).append(i)
    return list(groups.values())


def group_padded(news: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices split into forward passes whose new tokens are padded to the longest, cheaply.

    Rows are taken by increasing new-token count (stable); a group closes when the next row
    needs more than twice (plus 8) the group's smallest count, or when the padded token
    count ``widest * rows`` would exceed ``max_tokens`` (a group always takes one row).
    """
    groups: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(len(news)), key=news.__getitem__):
        if current:
            widest = max(news[i], news[current[-1]])
            too_uneven = news[i] > 2 * news[current[0]] + 8
            too_big = widest * (len(current) + 1) > max_tokens
            if too_uneven or too_big:
                groups.append(current)
                current = []
        current.append(i)
    if current:
        groups.append(current)
    return groups
