"""Per-prefix KV state of mlx-lm models: which caches can resume, and batching them.

A cached prefix is stored as one compact ``(keys, values)`` pair per layer, each of shape
``(1, kv_heads, length, head_dim)``, never as a live cache object: live caches grow in
place, stored prefixes must not change. A batch of contexts with different cached lengths
becomes one ``BatchKVCache`` per layer, laid out as mlx-lm's ``BatchKVCache.merge`` does
(cached parts left-padded and masked out, per-row RoPE offsets); rows of one batch add
the same number of new tokens, so the new part needs no padding. Only the public cache
API is used: the ``BatchKVCache`` constructor and its ``state`` property.
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


def merge(
    entries: Sequence[PrefixKV | None], num_layers: int, new_tokens: int
) -> list[BatchKVCache]:
    """One left-padded ``BatchKVCache`` per layer holding each row's cached prefix (or none).

    This is ``BatchKVCache.merge`` with room for ``new_tokens`` more positions: mlx-lm's
    merge sizes its buffers to the prefixes, so the forward pass's first write would
    reallocate them in 256-position steps (zero-fill and copy every row's KV again).
    Built through the public constructor and ``state`` setter.
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
            _, _, offset, left_padding, _ = cache.state
            cache.state = (keys, values, offset + longest, left_padding, longest)
        merged.append(cache)
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
