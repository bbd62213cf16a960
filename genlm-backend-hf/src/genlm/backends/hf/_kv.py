"""Automatic KV reuse: per-segment KV deltas in core's ``PrefixCache``, and the batched past.

Storage design. A cache entry for the context ``c[:m]`` holds a :class:`Segment`: the keys
and values of the tokens ``c[start:m]`` only (for every layer, stacked in one tensor of shape
``[layers, 2, kv_heads, m - start, head_dim]``), plus a weak reference to the segment of
``c[:start]``, its parent. The full past of a context is the chain of segments from the root.
So the SMC pattern (16 particles sharing a 160-token prompt, one token each per step) stores
the prompt once and about one token per particle per step, instead of a full copy of every
particle's context per step: memory grows with the number of distinct tokens, not with
particles times context length.

Why weak parent references: an entry evicted by the byte budget must free its memory even
when children still exist, or the budget would not bound memory. A child whose parent died is
an orphan; lookups drop orphans and fall back to a shorter prefix. Under memory pressure
ancestors are touched root first, so LRU drops whole dead branches before the roots of live
ones; a pinned prompt (``cache_kv``) pins its whole chain.

Why merging: a chain of one-token segments would cost one trie walk and one tensor copy per
token per request. When a new segment is stored, it absorbs its trailing ancestors while they
are no longer than it (a binary counter), so chains stay logarithmic in the number of steps at
the price of storing some tokens twice (about ``log2(steps)`` times on average, still tiny
next to full-context copies).

The batched past. Rows of a batch have different past lengths ``p_i`` and new lengths
``n_i``. The past is left-padded to ``P = max p_i`` and the new tokens to ``N = max n_i``, in a
preallocated buffer ``[layers, 2, B, kv_heads, P + N, head_dim]`` (reused between batches, so
no page faults). A cache layer over that buffer writes the new keys and values in place
instead of concatenating; the attention mask zeros the padded past and padded new positions,
and explicit position ids give each row its own positions. Masked columns must still hold
finite values (a masked column's weight is exactly 0, and 0 * NaN is NaN), so the padding
and a length bucket's extra columns (``HFLM(kv_length_multiple=...)``) are zeroed.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence

import attrs
import numpy as np
import torch

# transformers >= 4.56 (we require 4.57.1): caches are lists of layer objects we can subclass.
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from genlm.core.backend import PrefixCache, RowPlan, group_equal, group_padded

logger = logging.getLogger(__name__)

#: Python-side overhead charged per stored segment, on top of its tensor bytes.
SEGMENT_OVERHEAD_BYTES = 256


class Segment:
    """The keys and values of tokens ``start .. start + length`` of one context.

    ``kv`` has shape ``[layers, 2, kv_heads, length, head_dim]``; ``parent`` is a weak
    reference to the segment ending at ``start`` (None when ``start == 0``).
    """

    __slots__ = ("__weakref__", "kv", "parent", "start")

    def __init__(self, start: int, kv: torch.Tensor, parent: Segment | None):
        self.start = start
        self.kv = kv
        self.parent = None if parent is None else weakref.ref(parent)

    @property
    def end(self) -> int:
        return self.start + self.kv.shape[3]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size() + SEGMENT_OVERHEAD_BYTES


#: A row of a batch (core's plan): ``cached`` holds its past as ``(segment, used)`` pieces
#: in order, the first ``used`` tokens of each, adding up to ``past``.
Row = RowPlan[list[tuple[Segment, int]]]


def extends_cached_entry(row: Row) -> bool:
    """Whether the row's past ends exactly at a stored segment (so the new one can link to it)."""
    return not row.cached or row.cached[-1][0].end == row.past


@attrs.frozen
class KVShape:
    """Per-token KV geometry, the same for every layer."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype.itemsize


class KVStore:
    """Segments of every cached context, keyed by ``(variant marker, *context)``.

    ``max_bytes`` bounds their tensor bytes plus :data:`SEGMENT_OVERHEAD_BYTES` each.
    """

    def __init__(self, max_bytes: int):
        self.cache: PrefixCache[Segment] = PrefixCache(max_bytes)

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes

    def __len__(self) -> int:
        return len(self.cache)

    def clear(self, keep_pinned: bool = False) -> None:
        self.cache.clear(keep_pinned=keep_pinned)

    def chain(self, marker: int, context: Sequence[int], limit: int) -> list[tuple[Segment, int]]:
        """The cached pieces covering the longest prefix of ``context`` of at most ``limit`` tokens.

        Orphans met on the way (a segment whose parent was evicted) are dropped.
        """
        key = (marker, *context)
        while True:
            hit = self.cache.longest_prefix(key)
            if hit.value is None:
                return []
            chain = [hit.value]
            while chain[-1].start > 0:
                parent = chain[-1].parent()
                if parent is None:
                    break
                chain.append(parent)
            if chain[-1].start > 0:  # an orphan: its memory is useless, drop it and retry
                self.cache.remove(key[: 1 + chain[-1].end])
                continue
            chain.reverse()
            if self.cache.nbytes > self.cache.max_bytes // 2:
                # Near the budget, LRU order matters: make ancestors at least as recent as
                # their descendants, so eviction takes dead branches and not live roots.
                for segment in chain:
                    self.cache.get(key[: 1 + segment.end])
            usable = min(chain[-1].end, limit)
            return [(s, min(s.end, usable) - s.start) for s in chain if s.start < usable]

    def pin_chain(self, marker: int, context: Sequence[int]) -> bool:
        """Pin every segment on the path of ``context`` if they hold its whole KV; whether
        they did (else nothing is pinned: a part of a prompt pinned would hold budget for
        good without serving it)."""
        key = (marker, *context)
        pieces = self.chain(marker, context, len(context))
        if sum(used for _, used in pieces) < len(context):
            return False
        for segment, _ in pieces:
            self.cache.pin(key[: 1 + segment.end])
        return True

    def store(self, marker: int, row: Row, take: Callable[[int], torch.Tensor]) -> None:
        """Store the new tokens of ``row`` (and the short ancestors it absorbs) as one segment.

        ``take(start)`` returns the row's KV of positions ``start ..`` to the end, shape
        ``[layers, 2, kv_heads, length, head_dim]``, possibly a view into the batch buffer;
        the stored segment is a compact copy.
        """
        if not extends_cached_entry(row):
            # The context itself is cached (its last token was recomputed): keep that entry,
            # children may hold weak references to it. Otherwise the key is new, as contexts
            # in a batch are distinct and a cached context is always found by the lookup.
            return
        key = (marker, *row.context)
        start, parent_index = row.past, len(row.cached) - 1
        length = row.new
        while parent_index >= 0:  # absorb trailing ancestors no longer than us (binary counter)
            segment, used = row.cached[parent_index]
            if used != segment.end - segment.start or used > length:
                break
            if self.cache.is_pinned(key[: 1 + segment.end]):
                break  # a pinned prompt stays shared: a copy in this segment would waste it
            start, length = segment.start, length + used
            parent_index -= 1
        parent = row.cached[parent_index][0] if parent_index >= 0 else None
        if parent is not None and parent.end != start:
            return  # cannot happen with whole pieces; guard keeps the invariant explicit
        kv = take(start).clone(memory_format=torch.contiguous_format)
        segment = Segment(start, kv, parent)
        self.cache.insert(key, segment, segment.nbytes)


class BufferedLayer(DynamicLayer if DynamicLayer is not None else object):
    """A cache layer over preallocated ``[B, H, columns, D]`` tensors, filled in place.

    The past is already in the buffer; ``update`` writes the new keys and values after it
    instead of concatenating (which would copy the whole past once more per forward).
    Attention spans at least ``columns`` columns (a length bucket); those after
    ``past + new`` lie after every query, so the causal mask hides them (the caller zeroes
    them).
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, past: int, columns: int = 0):
        super().__init__()
        self.keys, self.values = keys, values
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.length = past
        self.columns = columns

    def update(self, key_states, value_states, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        width = max(end, self.columns)
        if width > self.keys.shape[-2]:
            raise RuntimeError(
                f"KV buffer of {self.keys.shape[-2]} positions overflowed to {width}"
            )
        self.keys[:, :, self.length : end].copy_(key_states)
        self.values[:, :, self.length : end].copy_(value_states)
        self.length = end
        return self.keys[:, :, :width], self.values[:, :, :width]

    def get_mask_sizes(self, query_length: int | torch.Tensor) -> tuple[int, int]:
        if isinstance(query_length, torch.Tensor):  # transformers 4.57: the cache_position
            query_length = query_length.shape[0]
        return max(self.length + query_length, self.columns), 0

    def get_seq_length(self) -> int:
        return self.length


class BufferedCache(DynamicCache):
    """A ``DynamicCache`` whose layers are :class:`BufferedLayer` views of one buffer."""

    def __init__(self, buffer: torch.Tensor, past: int, columns: int = 0):
        Cache.__init__(self, layers=[BufferedLayer(kv[0], kv[1], past, columns) for kv in buffer])


def layer_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The ``(keys, values)`` of every layer of a transformers cache."""
    cache = getattr(cache, "self_attention_cache", cache)  # EncoderDecoderCache (GPTBigCode, 4.57)
    return [(layer.keys, layer.values) for layer in cache.layers]


class BatchInputs:
    """Padded model inputs of a group of rows, and the KV buffer their past was copied into."""

    def __init__(self, rows: list[Row], buffer: torch.Tensor, pad_id: int):
        self.rows = rows
        self.buffer = buffer  # [layers, 2, B, H, P + N, D], possibly a strided view
        self.past = max(r.past for r in rows)
        self.new = max(r.new for r in rows)
        b, p, n = len(rows), self.past, self.new
        ids = np.full((b, n), pad_id, dtype=np.int64)
        positions = np.zeros((b, n), dtype=np.int64)
        mask = np.zeros((b, p + n), dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, n - row.new :] = row.context[row.past :]
            positions[i, n - row.new :] = np.arange(row.past, len(row.context))
            mask[i, p - row.past : p] = 1
            mask[i, p + n - row.new :] = 1
        device = buffer.device
        self.input_ids = torch.from_numpy(ids).to(device)
        self.position_ids = torch.from_numpy(positions).to(device)
        self.attention_mask = torch.from_numpy(mask).to(device)

    def chunks(self, max_tokens: int) -> list[tuple[int, int]]:
        """The new-token columns ``[start, end)`` of successive forward passes.

        Each pass runs at most ``max_tokens`` padded new tokens (at least one column), so a
        long prefill runs in several passes, each resuming from the KV the last one wrote.
        """
        step = max(1, max_tokens // len(self.rows))
        return [(start, min(start + step, self.new)) for start in range(0, self.new, step)]

    def model_inputs(self, start: int, end: int, columns: int) -> dict[str, torch.Tensor]:
        """Inputs for new-token columns ``[start, end)``, the mask ``columns`` wide.

        The mask covers the past and the new tokens up to ``end``; any bucket columns after
        them are masked (0).
        """
        mask = self.attention_mask[:, : self.past + end]
        if columns > mask.shape[1]:
            mask = torch.nn.functional.pad(mask, (0, columns - mask.shape[1]))
        return {
            "input_ids": self.input_ids[:, start:end],
            "position_ids": self.position_ids[:, start:end],
            "attention_mask": mask,
        }

    def fill_past(self, skip: frozenset[int] = frozenset()) -> None:
        """Copy each row's cached pieces into the buffer, right-aligned at ``P``; zero the padding.

        Rows in ``skip`` already hold their past there.
        """
        p = self.past
        for i, row in enumerate(self.rows):
            if i in skip:
                continue
            offset = p - row.past
            dest = self.buffer[:, :, i]
            if offset:
                dest[:, :, :, :offset].zero_()
            for segment, used in row.cached:
                dest[:, :, :, offset : offset + used].copy_(segment.kv[:, :, :, :used])
                offset += used

    def row_kv(self, i: int, start: int) -> torch.Tensor:
        """Row ``i``'s KV from context position ``start`` to its end, ``[layers, 2, H, len, D]``.

        A view into the buffer, unless it spans the gap between a row's past and its
        left-padded new tokens (then a concatenated copy).
        """
        row = self.rows[i]
        p, n = self.past, self.new
        new_begin = p + n - row.new  # buffer column of the row's first new token
        if start >= row.past:
            return self.buffer[:, :, i, :, new_begin + start - row.past :]
        past = self.buffer[:, :, i, :, p - row.past + start : p]
        if row.new == n:  # no gap: the past runs straight into the new tokens
            return self.buffer[:, :, i, :, p - row.past + start :]
        return torch.cat([past, self.buffer[:, :, i, :, new_begin:]], dim=3)


def group_rows(rows: list[Row], max_tokens: int, equal_new: bool = False) -> list[list[Row]]:
    """Rows split into forward passes with little padding (core's :func:`group_padded`), or,
    with ``equal_new``, into passes of rows that add the same number of tokens (core's
    :func:`group_equal`): no padding then separates a row's past from its new tokens. Either
    way a group holds at most ``max_tokens`` rows, so that its passes of one column or more
    (:meth:`BatchInputs.chunks`) stay within ``max_tokens`` new tokens."""
    news = [r.new for r in rows]
    if equal_new:
        size = max(1, max_tokens)
        groups = [g[i : i + size] for g in group_equal(news) for i in range(0, len(g), size)]
    else:
        groups = group_padded(news, max_tokens)
    return [[rows[i] for i in group] for group in groups]
