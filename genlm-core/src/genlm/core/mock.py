"""``MockLM``: a deterministic fake language model over any vocabulary.

Downstream users test their programs with it: every context gets its own
distribution, a pure function of the whole context (a BLAKE2 hash seeds the draw, so
two contexts never share one by accident), normalized over the vocabulary.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from genlm.core._embedded import resolve_model_path
from genlm.core._model import BatchedLM
from genlm.core._validation import check_token_bytes, checked_count, checked_seconds, is_integer
from genlm.core._vocab import Vocabulary

_logger = logging.getLogger(__name__)

#: Longest ``latency_s`` (about 31 years, forever for a test): ``time.sleep`` overflows on
#: longer ones on some platforms (from 9.3e9 s on Linux), which failed every batch.
_MAX_LATENCY_S = 1e9

#: Why a mock made by :meth:`MockLM.from_name` has no tokenizer where ``tokenizers`` is
#: missing: logged by the loader and said by ``genlm smc``, which needs one to encode text.
_NO_TOKENIZERS = (
    "the mock reads a tokenizer.json's tokenizer with the `tokenizers` package, which is "
    "not installed (pip install tokenizers)"
)


def context_seed(context: Sequence[int], seed: int = 0) -> int:
    """A 64-bit seed that is a hash of the whole context and the mock's seed."""
    data = np.asarray([seed, *context], dtype=np.int64).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def mock_logprobs(context: Sequence[int], vocab_size: int, seed: int = 0) -> np.ndarray:
    """The mock's log-probabilities for one context: float64, ``(vocab_size,)``, normalized.

    Use it as the independent expectation when testing code that runs on a ``MockLM``.
    """
    rng = np.random.default_rng(context_seed(context, seed))
    logits = rng.standard_normal(vocab_size) * 3.0
    logits -= logits.max()
    return logits - np.log(np.exp(logits).sum())


class MockLM(BatchedLM):
    """A deterministic, normalized, collision-free mock model.

    Args:
        vocab: a :class:`Vocabulary` or a list of byte strings (one per token id); another
            entry (an int, a str) is a ``TypeError`` naming it.
        tokenizer: returned by ``lm.tokenizer`` (e.g. to encode prompts); None for none.
        latency_s: sleep this long per batch, to imitate a forward pass (seconds, at most
            1e9).
        seed: changes every distribution (two mocks with different seeds differ).
        keep_batches: how many of the latest batches :attr:`batches` holds, so that a
            long run does not grow it without limit (0: none).
        **kwargs: scheduler and cache options of :class:`BatchedLM`.

    Options are checked here, as :class:`BatchedLM`'s are: one of the wrong type (a
    string, None, a float ``keep_batches``) is a ``TypeError``, one out of range (a
    negative, NaN or infinite one) a ``ValueError``, each naming the option.
    """

    #: Default of ``keep_batches``.
    KEEP_BATCHES = 1000
    #: Each batch is a fresh ``np.stack``: core keeps it without a copy.
    stable_batches = True

    def __init__(
        self,
        vocab: Vocabulary | Sequence[bytes],
        *,
        tokenizer: Any = None,
        latency_s: float = 0.0,
        seed: int = 0,
        keep_batches: int = KEEP_BATCHES,
        **kwargs: Any,
    ):
        if not isinstance(vocab, Vocabulary):
            tokens = tuple(vocab)
            check_token_bytes(tokens)  # bytes(t) would make an int t NUL bytes
            vocab = Vocabulary(tuple(map(bytes, tokens)))  # subclasses (Token) as plain bytes
        kwargs.setdefault("name", "mock")
        super().__init__(vocab, tokenizer, **kwargs)
        keep_batches = checked_count("keep_batches", keep_batches, 0)
        latency_s = checked_seconds("latency_s", latency_s)
        if latency_s > _MAX_LATENCY_S:
            raise ValueError(
                f"latency_s must be at most {_MAX_LATENCY_S:g} s (time.sleep's range), "
                f"got {latency_s}"
            )
        if not is_integer(seed):
            raise TypeError(f"seed must be an integer, got {seed!r}")
        if not -(2**63) <= seed < 2**63:  # it seeds an int64 stream per context
            raise ValueError(f"seed must fit in 64 bits (int64), got {seed}")
        self.latency_s = latency_s
        self.seed = seed
        self.keep_batches = keep_batches
        #: Contexts the backend evaluated, batch by batch, oldest first: the latest
        #: ``keep_batches`` batches only (tests inspect batching).
        self.batches: list[list[tuple[int, ...]]] = []
        #: Batches and contexts evaluated since the mock was made, all of them.
        self.batch_count = 0
        self.context_count = 0

    @classmethod
    def from_name(cls, name: str, **kwargs: Any) -> MockLM:
        """A mock over the vocabulary of a ``tokenizer.json`` (or a directory holding one)
        or an embedded model (``"stories260K"``): the loader of the ``mock`` backend.

        Where the ``tokenizers`` package is installed and reads the file, the mock also
        gets that file's tokenizer (:class:`TokenizerFile`, unless ``tokenizer=`` is
        given), so that tools which encode text prompts (``genlm smc``) run on it as on
        the real model; else it has none, and says why in the log (INFO when
        ``tokenizers`` is not installed, a warning when it cannot read the file).
        """
        path = Path(resolve_model_path(name))
        if not path.exists():
            raise FileNotFoundError(
                f"mock backend: {name!r} is neither a tokenizer directory nor an embedded model"
            )
        vocab = Vocabulary.from_tokenizer_json(path)  # names a missing tokenizer.json
        if "tokenizer" not in kwargs:
            if importlib.util.find_spec("tokenizers") is None:
                _logger.info("mock backend: no tokenizer for %s: %s", path, _NO_TOKENIZERS)
            else:
                try:
                    kwargs["tokenizer"] = TokenizerFile(path)
                except Exception as exc:  # noqa: BLE001 - a format this tokenizers cannot read
                    _logger.warning(
                        "mock backend: no tokenizer, tokenizers cannot read %s: %s", path, exc
                    )
        return cls(vocab, **kwargs)

    def _logprobs_batch(self, contexts: list[tuple[int, ...]], variant: Hashable) -> np.ndarray:
        self.batch_count += 1
        self.context_count += len(contexts)
        self.batches.append(list(contexts))
        if len(self.batches) > self.keep_batches:
            del self.batches[0]
        if self.latency_s:
            time.sleep(self.latency_s)
        return np.stack([mock_logprobs(c, len(self.vocab), self.seed) for c in contexts])


class TokenizerFile:
    """A ``tokenizer.json``'s tokenizer (the ``tokenizers`` package) with the calls GenLM's
    tools make of a transformers tokenizer: ``encode`` to a list of ids (special tokens
    such as BOS added unless ``add_special_tokens=False``) and ``decode``.

    Args:
        path: a ``tokenizer.json`` or a directory holding one.
    """

    def __init__(self, path: str | Path):
        import tokenizers

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        self._tokenizer = tokenizers.Tokenizer.from_file(str(file))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of ``text``."""
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids``."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
