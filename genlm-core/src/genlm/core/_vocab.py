"""TEMPORARY minimal Vocabulary; replaced by the vocab branch at merge."""

from __future__ import annotations

import attrs
import numpy as np


@attrs.frozen
class Vocabulary:
    tokens: tuple[bytes, ...]
    special_ids: frozenset[int] = frozenset()
    unused_ids: frozenset[int] = frozenset()
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> bytes:
        return self.tokens[i]

    def is_special(self, i: int) -> bool:
        return i in self.special_ids

    @property
    def byte_vocab(self) -> list[bytes]:
        return list(self.tokens)

    @property
    def text_ids(self) -> np.ndarray:
        skip = self.special_ids | self.unused_ids
        return np.array([i for i in range(len(self.tokens)) if i not in skip], dtype=np.int64)

    @classmethod
    def from_tokenizer_json(cls, path):
        raise NotImplementedError


def decode_vocab(tokenizer, size=None):
    raise NotImplementedError
