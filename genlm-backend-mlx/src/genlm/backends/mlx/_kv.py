"""Per-prefix KV state of mlx-lm models: which caches can resume, and batching them.

A cached prefix is stored as one compact ``(keys, values)`` pair per layer, each of shape
``(1, kv_heads, length, head_dim)``, never as a live cache object: live caches grow in
place, stored prefixes must not change. A batch of contexts with different cached lengths
becomes one ``BatchKVCache`` per layer through mlx-lm's public ``BatchKVCache.merge``
(cached parts left-padded and masked out, per-row RoPE offsets); rows of one batch add
the same number of new tokens, so the new part needs no padding. Only the public cache
API is used: ``KVCache.from_state``, ``BatchKVCache.merge`` and the ``state`` property.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

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


def merge(entries: Sequence[PrefixKV | None], num_layers: int) -> list[BatchKVCache]:
    """One left-padded ``BatchKVCache`` per layer holding each row's cached prefix (or none)."""
    merged = []
    for layer in range(num_layers):
        rows = []
        for entry in entries:
            if entry is None:
                rows.append(KVCache())
            else:
                keys, values = entry[layer]
                rows.append(KVCache.from_state((keys, values, keys.shape[2])))
        merged.append(BatchKVCache.merge(rows))
    return merged


def split(
    caches: Sequence[BatchKVCache], prefix_lengths: Sequence[int], new_lengths: Sequence[int]
) -> list[PrefixKV]:
    """Each row's KV over its whole context, copied out of a batch run after :func:`merge`.

    Row ``i`` sits at ``[pad_i, max_prefix + new_i)`` of the batch buffers, where
    ``pad_i = max_prefix - prefix_i`` is the left padding :func:`merge` gave it.
    """
    max_prefix = max(prefix_lengths)
    out = []
    for row, (prefix, new) in enumerate(zip(prefix_lengths, new_lengths)):
        start, stop = max_prefix - prefix, max_prefix + new
        layers = []
        for cache in caches:
            keys, values = cache.state[:2]
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
