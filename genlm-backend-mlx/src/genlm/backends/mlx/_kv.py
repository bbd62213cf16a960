"""Per-prefix KV state of mlx-lm models: which caches can resume, batching them, the live batch.

A cached prefix is stored as one compact ``(keys, values)`` pair per layer, each of shape
``(1, kv_heads, length, head_dim)``, never as a live cache object: live caches grow in
place, stored prefixes must not change. A batch of contexts with different cached lengths
becomes one ``BatchKVCache`` per layer, laid out as mlx-lm's ``BatchKVCache.merge`` does
(cached parts left-padded and masked out, per-row RoPE offsets); rows of one batch add
the same number of new tokens, so the new part needs no padding. The caches of the last
batch stay alive as a :class:`LiveBatch`, so a next batch that extends its rows (the SMC
step) runs in place instead of being rebuilt from stored prefixes; :class:`KVStore` keeps
both under one byte budget. Only the public cache API is used: the ``BatchKVCache``
constructor, its ``keys``, ``values``, ``offset`` and ``left_padding``, its ``state``
property and ``filter``.

``BatchKVCache.state`` changed in mlx-lm 0.32: it is ``(keys, values, offset,
left_padding, idx)`` over the whole buffers, where 0.30 and 0.31 give the first four cut at
``idx`` and their setter takes ``idx`` from the keys' length. :func:`merge` and
:func:`split` serve both (see :func:`_state_has_idx`).
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from genlm.core.backend import PrefixCache, PrefixHit, ResidentRows

#: One layer's cached keys and values, each ``(1, kv_heads, length, head_dim)``.
LayerKV = tuple[mx.array, mx.array]
#: A cached prefix: one :data:`LayerKV` per layer.
PrefixKV = tuple[LayerKV, ...]


def non_resumable_types(caches: Sequence[object]) -> list[str]:
    """Names of the layer cache types that cannot resume from a stored prefix.

    Only plain ``KVCache`` layers qualify: a rotating (sliding-window) cache forgets or
    keeps tokens depending on how far it has run, and state-space caches (``ArraysCache``,
    ``MambaCache``) hold a recurrent state that cannot be merged into a padded batch.
    """
    return sorted({type(c).__name__ for c in caches if type(c) is not KVCache})


#: Model types whose forward breaks on a batch of rows resumed with ``BatchKVCache``
#: although their layers are plain ``KVCache``, each with why. A hand list, so a risk: an
#: architecture that breaks the same way (one mlx-lm adds, or one nobody has checked) goes
#: unlisted until found, and resumes wrong rows or fails its batches. A probe at
#: construction (a resumed batch against plain forwards) would catch it, at the cost of
#: forward passes and a tolerance fit for every model's dtype; not worth it for now.
_BATCH_UNSAFE_TYPES = {
    # Rows come out wrong, or the batch fails to broadcast.
    "gemma2": "attention adds the per-row (B, 1, L, S) mask to queries it shapes "
    "(B, kv_heads, repeats, L, D)",
    # Any group of two rows or more fails ("Only length-1 arrays can be converted").
    "gpt_bigcode": "positions come from np.arange(cache[0].offset, ...), one offset where "
    "batched rows have one each",
}


def batch_resume_problem(model: object) -> str | None:
    """Why ``model`` must not resume batched rows from stored KV, or None: its type is in
    :data:`_BATCH_UNSAFE_TYPES`, or a RoPE module of it scales by the sequence length:
    mlx-lm's ``DynamicNTKScalingRoPE`` and ``DynamicNTKAlphaRoPE`` (Llama or Qwen2 with
    ``rope_scaling`` "dynamic", InternLM2 before mlx-lm 0.32, InternLM3, Hunyuan), and
    before mlx-lm 0.31 ``SuScaledRoPE`` (Phi-3's "longrope", PhiMoE, MiniCPM3), whose
    ``offset + L > original_max_position_embeddings`` fails on per-row offsets (every
    batch of two resumed rows failed)."""
    model_type = getattr(model, "model_type", None) or getattr(
        getattr(model, "args", None), "model_type", None
    )
    if model_type in _BATCH_UNSAFE_TYPES:
        return (
            f"mlx-lm's {model_type} breaks on batched rows resumed from stored KV: "
            f"{_BATCH_UNSAFE_TYPES[model_type]}"
        )
    scaled = ("DynamicNTK", "SuScaledRoPE") if _mlx_lm_version() < (0, 31) else ("DynamicNTK",)
    modules = model.modules() if hasattr(model, "modules") else []
    names = sorted({type(m).__name__ for m in modules if type(m).__name__.startswith(scaled)})
    if names:
        return (
            f"its {'/'.join(names)} scales by the sequence length and takes one position "
            "offset, not the per-row offsets of batched rows resumed from stored KV"
        )
    return None


@functools.cache
def _mlx_lm_version() -> tuple[int, int]:
    """The installed mlx-lm's (major, minor) version."""
    major, minor = (int(part) for part in importlib.metadata.version("mlx-lm").split(".")[:2])
    return major, minor


def _state_has_idx() -> bool:
    """Whether the installed mlx-lm's ``BatchKVCache.state`` ends with the write position."""
    return _mlx_lm_version() >= (0, 32)


def _stop(cache: BatchKVCache) -> int:
    """Where the batch's rows end in the cache's buffers (its write position)."""
    state = cache.state
    return state[4] if _state_has_idx() else state[0].shape[2]


def merge(
    entries: Sequence[PrefixKV | None], num_layers: int, new_tokens: int
) -> list[BatchKVCache]:
    """One left-padded ``BatchKVCache`` per layer holding each row's cached prefix (or none).

    This is ``BatchKVCache.merge`` with room for ``new_tokens`` more positions: mlx-lm's
    merge sizes its buffers to the prefixes, so the forward pass's first write would
    reallocate them in 256-position steps (zero-fill and copy every row's KV again).
    Built through the public constructor and ``state`` setter; before mlx-lm 0.32 the
    setter cannot leave room after the prefixes, so the buffers grow as mlx-lm's do.
    """
    lengths = [0 if entry is None else entry[0][0].shape[2] for entry in entries]
    longest = max(lengths)
    padding = [longest - n for n in lengths]
    merged = []
    for layer in range(num_layers):
        cache = BatchKVCache(padding)
        if longest:
            keys_like, values_like = next(e[layer] for e in entries if e is not None)
            rows, heads = len(entries), keys_like.shape[1]
            size = longest + new_tokens
            keys = mx.zeros((rows, heads, size, keys_like.shape[3]), keys_like.dtype)
            values = mx.zeros((rows, heads, size, values_like.shape[3]), values_like.dtype)
            for row, (entry, pad) in enumerate(zip(entries, padding)):
                if entry is not None:
                    keys[row : row + 1, :, pad:longest] = entry[layer][0]
                    values[row : row + 1, :, pad:longest] = entry[layer][1]
            offset, left_padding = cache.offset + longest, cache.left_padding
            if _state_has_idx():
                cache.state = (keys, values, offset, left_padding, longest)
            else:
                cache.state = (
                    keys[..., :longest, :],
                    values[..., :longest, :],
                    offset,
                    left_padding,
                )
        merged.append(cache)
    return merged


def split(caches: Sequence[BatchKVCache]) -> list[PrefixKV]:
    """A compact copy of the KV of each row of a batch, over the row's whole context.

    Row ``i`` holds its context at ``[left_padding[i], idx)`` of the batch buffers: left
    padding is where :func:`merge` (or a later ``filter``) put it, and rows of one batch
    always end together.
    """
    left_padding = caches[0].left_padding.tolist()
    stops = [_stop(cache) for cache in caches]
    out = []
    for row, start in enumerate(left_padding):
        layers = []
        for cache, stop in zip(caches, stops):
            keys, values = cache.keys, cache.values
            layers.append(
                (
                    mx.contiguous(keys[row : row + 1, :, start:stop]),
                    mx.contiguous(values[row : row + 1, :, start:stop]),
                )
            )
        out.append(tuple(layers))
    return out


def nbytes(entry: PrefixKV) -> int:
    """Bytes held by a stored prefix."""
    return sum(k.nbytes + v.nbytes for k, v in entry)


class LiveBatch:
    """The caches of the last forward pass, kept so the next batch can extend them in place.

    In the SMC pattern every request of a step extends a context of the previous step by
    one token (resampling repeats or drops particles). Rebuilding each row from stored
    prefixes and copying each whole context back out costs O(context) copies per row per
    step; here the rows are gathered on the batch axis (``BatchKVCache.filter``, a no-op
    when the rows keep their order) and the new tokens are written after them.

    Attributes:
        rows: the context held by each row (core's row matching: which row a context
            extends, whether a whole batch extends the rows in place).
        caches: one ``BatchKVCache`` per layer; row ``i`` holds ``contexts[i]``.
        copied: whether the prefix cache also holds compact copies of the rows (true for a
            batch just rebuilt from it, false once it has advanced in place).
        marker: the KV marker of the adapter the rows were computed under (see
            :func:`key`), None for the base model.
    """

    def __init__(
        self,
        contexts: Sequence[tuple[int, ...]],
        caches: list[BatchKVCache],
        marker: int | None = None,
    ):
        self.caches = caches
        self.copied = True
        self.rows = ResidentRows(contexts)
        self.marker = marker

    @property
    def contexts(self) -> list[tuple[int, ...]]:
        """The context held by each row."""
        return self.rows.contexts

    @property
    def nbytes(self) -> int:
        """Bytes of the batch buffers (padding and growth room included)."""
        return sum(c.keys.nbytes + c.values.nbytes for c in self.caches)

    def advance(self, sources: Sequence[int], contexts: Sequence[tuple[int, ...]]) -> None:
        """Lay the rows out as ``sources`` (repeats fork a row, omissions drop it).

        The caller then runs the new tokens of ``contexts`` through :attr:`caches`.
        """
        if list(sources) != list(range(len(self.contexts))):
            index = mx.array(sources)
            for cache in self.caches:
                cache.filter(index)
        self.rows = ResidentRows(contexts)


#: Where the live batch's bytes are charged in the prefix cache: token ids are never
#: negative, so no context can reach (or be shadowed by) this entry.
_LIVE_KEY = (-1,)


def key(context: tuple[int, ...], marker: int | None) -> tuple[int, ...]:
    """The prefix cache's key of ``context`` under an adapter's KV marker (a negative
    number below -1, so no key of another adapter, of the base model, or the live batch's
    :data:`_LIVE_KEY` starts like it), or the context itself for the base model."""
    return context if marker is None else (marker, *context)


class KVStore:
    """All the KV a model keeps: compact prefixes, and the live batch, under one budget.

    ``prefixes`` maps contexts to compact copies. The live batch's buffers are charged to
    it as one pinned entry under a key no context has (:data:`_LIVE_KEY`), so stored
    prefixes are evicted to make room for the live batch and the budget (``max_bytes``,
    the model's ``kv_cache_bytes``) bounds both, while a step advanced in place touches the
    trie once, not once per row.
    """

    def __init__(self, max_bytes: int):
        self.prefixes: PrefixCache[PrefixKV | None] = PrefixCache(max_bytes)
        self.live: LiveBatch | None = None

    @property
    def max_bytes(self) -> int:
        return self.prefixes.max_bytes

    @property
    def nbytes(self) -> int:
        """Bytes of stored prefixes and of the live batch."""
        return self.prefixes.nbytes

    def __len__(self) -> int:
        """Number of contexts whose KV is kept (stored, or a live row only)."""
        if self.live is None:
            return len(self.prefixes)
        return len(self.prefixes) - 1 + (0 if self.live.copied else len(self.live.contexts))

    def longest_prefix(
        self, tokens: Sequence[int], max_length: int | None = None
    ) -> PrefixHit[PrefixKV | LiveBatch]:
        """The longest prefix of ``tokens`` (at most ``max_length``) whose KV is kept."""
        limit = len(tokens) if max_length is None else min(max_length, len(tokens))
        hit = self.prefixes.longest_prefix(tokens, limit)
        row = self.live.rows.row(tokens, limit) if self.live is not None else None
        if row is not None and len(self.live.contexts[row]) > hit.length:
            return PrefixHit(len(self.live.contexts[row]), self.live)
        return hit

    def keep(self, live: LiveBatch) -> bool:
        """Make ``live`` the live batch and charge it; False (nothing kept) if it cannot fit."""
        self.release()
        if not self.prefixes.insert(_LIVE_KEY, None, live.nbytes, pin=True):
            return False
        self.live = live
        return True

    def release(self) -> LiveBatch | None:
        """Detach the live batch (if any) and stop charging it; return it."""
        live, self.live = self.live, None
        if live is not None:
            self.prefixes.remove(_LIVE_KEY)
        return live

    def forget(self, marker: int) -> None:
        """Drop the KV of the adapter whose marker is ``marker``, the live batch too if it
        was computed under it."""
        self.prefixes.remove_below((marker,))
        if self.live is not None and self.live.marker == marker:
            self.release()

    def clear(self) -> None:
        self.prefixes.clear()
        self.live = None
