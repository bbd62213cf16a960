"""``ByteModel``: what every beam state of one byte-level model shares.

The token LM, the token-byte trie, the EOS ids, the beam options, and a cache of each
token context's next-token masses (one trie pass per context, reused by every state and
candidate that reaches the context). :class:`genlm.bytes.ByteLM` is this plus the
methods that make beam states; the beam (``_beam``) and healing (``_heal``) depend on
this module only, so no import circle runs through the public class.

EOS mode: True, EOS tokens that are ordinary text end the sequence (their mass is EOS);
False (prefilling), they count as the text they spell.
"""

from __future__ import annotations

import functools
import logging
import numbers
import sys
import weakref
from collections.abc import Hashable, Sequence
from typing import Any, Self

import numpy as np

from genlm.bytes._eos import split_eos
from genlm.bytes._mass_cache import MassCache
from genlm.bytes._types import NextTokens
from genlm.core import TokenByteTrie
from genlm.core.backend import compact_row, gather_all
from genlm.core.backend import is_torch as _is_torch

logger = logging.getLogger(__name__)


#: Each vocabulary's trie, by the vocabulary's identity, while it lives: every model of one
#: LM shares it. Building one takes about 0.5 s at 128k tokens, and clients make a model per
#: beam they start (genlm-control's ``ByteLLM``: each concurrent first call, an SMC step's
#: particles, starts one with ``ByteBeamState.initial``).
_TRIES: dict[int, tuple[weakref.ref[Any], TokenByteTrie]] = {}


def _trie_of(vocab: Any) -> TokenByteTrie:
    """The token-byte trie of ``vocab`` (a genlm-core ``Vocabulary``, immutable), built once
    while it lives; special and unused ids are atomic (no bytes to spell)."""
    key = id(vocab)
    hit = _TRIES.get(key)
    if hit is not None and hit[0]() is vocab:
        return hit[1]
    trie = TokenByteTrie(vocab.tokens, atomic_ids=set(vocab.special_ids) | set(vocab.unused_ids))
    try:  # the entry goes with the vocabulary (an id is reused only once it is freed)
        _TRIES[key] = (weakref.ref(vocab, lambda _: _TRIES.pop(key, None)), trie)
    except TypeError:  # a vocabulary object without weak references: not shared
        pass
    return trie


class ByteLMClosedError(RuntimeError):
    """The :class:`ByteLM` was closed; make a new one."""


def check_beam_options(
    K: int | None,
    prune_threshold: float,
    heal_max_backoff: int | None,
    heal_max_splits: int | None,
) -> None:
    """Reject beam options that would misbehave: one check for ``ByteLM`` and 0.2's
    ``BeamParams``, which validates when it is built."""
    if K is not None and not _is_count(K, 1):
        raise ValueError(f"K must be a positive beam width (an integer) or None, got {K!r}")
    if isinstance(prune_threshold, bool) or not isinstance(prune_threshold, numbers.Real):
        raise TypeError(f"prune_threshold must be a number in [0, 1), got {prune_threshold!r}")
    if not 0.0 <= prune_threshold < 1.0:
        raise ValueError(f"prune_threshold must be in [0, 1), got {prune_threshold}")
    for name, value in (
        ("heal_max_backoff", heal_max_backoff),
        ("heal_max_splits", heal_max_splits),
    ):
        if value is not None and not _is_count(value, 0):
            raise ValueError(f"{name} must be an integer >= 0 or None, got {value!r}")


def _is_count(value: object, least: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``least``."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and value >= least


def log_threshold(prune_threshold: float) -> float:
    """``log(prune_threshold)``, -inf for 0 (no pruning by share), without a log(0) warning."""
    return float(np.log(prune_threshold)) if prune_threshold else -np.inf


class AsyncClosing:
    """``async with`` support: leaving the block awaits :meth:`aclose`."""

    async def aclose(self) -> None:
        """Release what this object holds."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class ByteModel(AsyncClosing):
    """The shared half of :class:`genlm.bytes.ByteLM` (its options are documented there):
    trie, EOS handling, next-token masses and their cache, lifetime.

    Methods that need masses raise :class:`ByteLMClosedError` once the model is closed
    (also when it closes while the LM runs).
    """

    def __init__(
        self,
        lm: Any,
        *,
        K: int | None = 16,
        prune_threshold: float = 0.0,
        eos: Sequence[bytes] | None = None,
        heal: bool = True,
        heal_max_backoff: int | None = None,
        heal_max_splits: int | None = 8,
        cache_bytes: int = 256 * 2**20,
        lookahead: int = 1,
        close_lm: bool = False,
        verbose: bool = False,
        device_rows: bool | None = None,
    ):
        if not (hasattr(lm, "vocab") and hasattr(lm, "next_token_logprobs")):
            raise TypeError(
                f"expected a token language model (a genlm.core AsyncLM: 'vocab' and "
                f"'async next_token_logprobs'), got {lm!r}"
            )
        check_beam_options(K, prune_threshold, heal_max_backoff, heal_max_splits)
        if not _is_count(lookahead, 0):
            raise ValueError(f"lookahead must be an integer >= 0, got {lookahead!r}")
        if device_rows is not None and not isinstance(device_rows, bool):
            raise TypeError(f"device_rows must be True, False or None, got {device_rows!r}")
        self.lm = lm
        self.K = K
        self.prune_threshold = prune_threshold
        self.log_prune_threshold = log_threshold(prune_threshold)
        self.heal = heal
        self.heal_max_backoff = heal_max_backoff
        self.heal_max_splits = heal_max_splits
        self.cache_bytes = cache_bytes
        self.lookahead = lookahead
        self.close_lm = close_lm
        self.verbose = verbose
        #: Whether rows are asked for as torch tensors (``output="torch"``) and their masses
        #: computed on the rows' device (``_device``). None: when the LM keeps its rows on a
        #: device (its ``device_rows`` attribute, e.g. ``HFLM`` on a GPU).
        self.device_rows = (
            bool(getattr(lm, "device_rows", False)) if device_rows is None else device_rows
        )

        vocab = lm.vocab
        tokens = vocab.tokens
        self.eos_ids = _eos_ids(vocab, eos)
        not_text = set(vocab.special_ids) | set(vocab.unused_ids)
        # Every EOS token is masked in EOS mode (:meth:`masked_ids`), which is where EOS mass
        # is computed: the trie has no EOS node. EOS tokens that are ordinary text (e.g.
        # b"\n\n") stay in the trie at their bytes, for prefill, which counts them as text.
        self._eos = np.array(self.eos_ids, dtype=np.int64)
        self._text_eos = np.array(
            [i for i in self.eos_ids if i not in not_text and tokens[i]], dtype=np.int64
        )
        self.trie = _trie_of(vocab)
        self._root_lo = int(self.trie.child_start[self.trie.root])
        self._root_hi = int(self.trie.child_stop[self.trie.root])
        self.cache = MassCache(cache_bytes)
        #: Whether the LM has variants (a genlm-core model's ``current_variant``: the LoRA
        #: adapter its requests use), and the one the cached masses are of: the cache is
        #: cleared when the LM's changes (it served the old adapter's masses after
        #: ``set_lora`` or ``clear_lora``).
        self._has_variants = hasattr(type(lm), "current_variant")
        self._variant: Hashable = lm.current_variant if self._has_variants else None
        self._text_bytes: dict[bool, frozenset[int]] = {}
        self._closed = False

    @property
    def has_text_eos(self) -> bool:
        """Whether some EOS token is ordinary text (then prefill treats it as text)."""
        return len(self._text_eos) > 0

    def text_bytes(self, eos_mode: bool) -> frozenset[int]:
        """The byte values some token spelling text in ``eos_mode`` holds (healing asks:
        a byte no such token holds is unreachable whatever the LM says)."""
        cached = self._text_bytes.get(eos_mode)
        if cached is None:
            vocab = self.lm.vocab
            ids = np.setdiff1d(vocab.text_ids, self.masked_ids(eos_mode)).tolist()
            cached = frozenset().union(*(vocab.tokens[i] for i in ids))
            self._text_bytes[eos_mode] = cached
        return cached

    @functools.cached_property
    def text_eos_ids(self) -> frozenset[int]:
        """The EOS ids that are ordinary text (counted as text while prefilling)."""
        return frozenset(self._text_eos.tolist())

    def _longest_token(self, data: bytes) -> int:
        """The id of the longest text token that ``data`` starts with."""
        trie, node, best = self.trie, self.trie.root, None
        for b in data:
            node = trie.child(node, b)
            if node is None:
                break
            ids = trie.tokens_at(node)
            if len(ids):
                best = int(ids[0])
        if best is None:
            raise ValueError(
                "the vocabulary has no BOS token and no token starts the prompt "
                f"{data[:16]!r}; give token ids instead"
            )
        return best

    # ---- next-token masses -----------------------------------------------------------

    async def next_tokens(
        self,
        contexts: Sequence[tuple[int, ...]],
        eos_mode: bool = True,
        prefetch: Sequence[tuple[int, ...]] = (),
    ) -> list[NextTokens]:
        """:class:`NextTokens` of each context in ``eos_mode``; missing ones are requested
        concurrently (so the LM's scheduler batches them) and cached.

        ``prefetch``: contexts a later call will probably ask for. When some context is
        missing (so the LM runs anyway), the missing ones of these join the same batch: on
        a small model a forward pass costs about the same for a few more rows. They are
        guesses: one the LM refuses (past its context limit, say) is left out, and never
        fails the call.
        """
        self._check_open()
        variant = self._current_variant()
        found: dict[tuple[int, ...], NextTokens] = {}
        missing: dict[tuple[int, ...], None] = {}
        for ctx in contexts:
            hit = self.cache.get((ctx, eos_mode))
            if hit is not None:
                found[ctx] = hit
            elif ctx not in found:
                missing[ctx] = None
        if missing:
            limit = getattr(self.lm, "max_context_length", None) or sys.maxsize
            guesses = [
                ctx
                for ctx in dict.fromkeys(prefetch)
                if ctx not in missing and len(ctx) <= limit and (ctx, eos_mode) not in self.cache
            ]
            generation = self.cache.generation  # a clear_cache while we wait wins
            rows = await gather_all(
                [
                    *(self._row(ctx, variant) for ctx in missing),
                    *(self._guess(ctx, variant) for ctx in guesses),
                ]
            )
            self._check_open()
            for ctx, row in zip([*missing, *guesses], rows):
                if row is not None:
                    masses = self._masses(row, eos_mode, variant)
                    found[ctx] = self.cache.put((ctx, eos_mode), masses, generation)
        return [found[ctx] for ctx in contexts]

    def _current_variant(self) -> Hashable:
        """The LM's variant now; the cache is cleared first if its masses are of another
        (a step waiting for rows of the old one then caches nothing: the generation)."""
        if not self._has_variants:
            return None
        variant = self.lm.current_variant
        if variant != self._variant:
            self.cache.clear()
            self._variant = variant
        return variant

    async def _guess(self, ctx: tuple[int, ...], variant: Hashable) -> Any:
        """:meth:`_row` for a prefetched context, or None if the LM refuses it: a guess
        must not fail the contexts the caller needs (they fail on their own if the LM is
        broken)."""
        try:
            return await self._row(ctx, variant)
        except Exception:  # noqa: BLE001 - a refused guess is only not cached
            logger.debug("prefetch of a %d-token context refused", len(ctx), exc_info=True)
            return None

    def cached_logp(self, ctx: tuple[int, ...], eos_mode: bool) -> np.ndarray | None:
        """:attr:`NextTokens.logp` of ``ctx`` if cached, else None; no LM call, and the
        cache's recency order is not changed."""
        self._current_variant()
        hit = self.cache.get((ctx, eos_mode), touch=False)
        return None if hit is None else hit.logp

    async def _row(self, ctx: tuple[int, ...], variant: Hashable) -> Any:
        """The LM row of ``ctx`` under ``variant`` as the cache may keep it
        (:func:`kept_row`), reusing the other mode's cached row when there is one."""
        for eos_mode in (True, False):
            other = self.cache.get((ctx, eos_mode), touch=False)
            if other is not None and other.variant == variant:
                return other.lm_row
        # Named, not left to the LM's current one: it may change while this waits.
        options = {"variant": variant} if self._has_variants else {}
        if self.device_rows:
            return kept_row(await self.lm.next_token_logprobs(ctx, output="torch", **options))
        row = await self.lm.next_token_logprobs(ctx, **options)
        # A torch row not asked for (genlm-backend 0.3's models hand tensors) is read on the
        # host: a numpy view of the LM's tensor (writeable), so kept_row copies it.
        return kept_row(row.detach().cpu().numpy() if _is_torch(row) else row)

    def masked_ids(self, eos_mode: bool) -> np.ndarray:
        """The token ids that end the sequence in this mode: the one place EOS is decided.

        In EOS mode these are all the EOS ids: their mass is the EOS mass, and the ones that
        are ordinary text (``b"\\n\\n"``) never spell their bytes. While prefilling
        (``eos_mode`` False) nothing ends the sequence: text EOS tokens count as text.
        """
        return self._eos if eos_mode else self._eos[:0]

    def _masses(self, row: Any, eos_mode: bool, variant: Hashable) -> NextTokens:
        """The masses of ``row``, an LM row as :func:`kept_row` keeps it (computed under
        ``variant``), in ``eos_mode``."""
        masked = self.masked_ids(eos_mode)
        if _is_torch(row):  # device rows: masked and reduced where they lie
            from genlm.bytes._device import masked_log_masses

            lp, mass, log_eos = masked_log_masses(self.trie, row, masked)
        else:
            # ``row`` is read-only (kept_row): a float64 one is ``lp`` itself when nothing
            # is masked, else ``lp`` is a new array.
            lp, log_eos = split_eos(np.asarray(row, dtype=np.float64), masked, log=True)
            log_eos = float(log_eos)
            # The mass cache counts mass.nbytes: a trie output in a pooled block larger than
            # itself (up to twice, left by another caller) is copied out of it.
            mass = compact_row(self.trie.log_weight_sum(lp))
            # Shared through the cache (and handed out by the 0.2 API): never written to.
            if lp.flags.writeable:
                lp.setflags(write=False)
            mass.setflags(write=False)
        return NextTokens(row, lp, mass, log_eos, variant)

    def in_mode(self, ctx: tuple[int, ...], nxt: NextTokens, eos_mode: bool) -> NextTokens:
        """``ctx``'s :class:`NextTokens` for ``eos_mode``, cached or computed from ``nxt``'s
        LM row (the same context's, in either mode): no LM call, so switching modes needs
        no ``await``."""
        self._check_open()
        if nxt.variant != self._variant:  # of a variant the cache no longer holds
            return self._masses(nxt.lm_row, eos_mode, nxt.variant)
        hit = self.cache.get((ctx, eos_mode))
        if hit is not None:
            return hit
        return self.cache.put((ctx, eos_mode), self._masses(nxt.lm_row, eos_mode, nxt.variant))

    def clear_cache(self) -> None:
        """Forget every cached context's masses, and keep out those of steps waiting for
        the LM now (their rows may come from the LM as it was: clear the LM's own cache
        first after a change to it)."""
        self.cache.clear()

    # ---- lifetime ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ByteLMClosedError("this ByteLM is closed")

    async def aclose(self) -> None:
        """Drop the caches, and close the token LM if this object owns it (``close_lm``).

        Idempotent: every call awaits the LM's ``aclose`` (idempotent too, by the
        ``AsyncLM`` protocol), so with core's models a cancelled call still releases the
        LM, and a later one returns once the release is done, raising what it raised.
        """
        self._closed = True
        self.clear_cache()
        if self.close_lm:
            await self.lm.aclose()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} over {self.lm!r} K={self.K} "
            f"prune_threshold={self.prune_threshold} eos_ids={list(self.eos_ids)}>"
        )


def kept_row(row: Any) -> Any:
    """An LM row as the mass cache keeps it: memory that nobody writes to and that holds
    exactly the row (the cache counts its bytes; a view would keep the LM's whole batch
    alive), copied at most once.

    A read-only numpy row (core's rows are) is nobody's to write: kept as it is, or copied
    if it is a view (``genlm.core.backend.compact_row``). A writeable one belongs to the LM,
    which may fill it again on its next call: copied (the copy is made read-only, never the
    LM's array). A torch tensor cannot say it is read-only, so it is always one of our own:
    a clone unless ``compact_row`` made one already.
    """
    if isinstance(row, np.ndarray):
        if not row.flags.writeable:
            return compact_row(row)
        row = row.copy()
        row.setflags(write=False)
        return row
    kept = compact_row(row)
    return kept.clone() if kept is row else kept


def _eos_ids(vocab: Any, eos: Sequence[bytes] | None) -> tuple[int, ...]:
    """EOS token ids: the vocabulary's, or every id whose bytes are one of ``eos``."""
    if eos is None:
        return tuple(sorted(set(vocab.eos_token_ids)))
    if isinstance(eos, (bytes, str)):
        raise TypeError("eos must be a list of byte strings, e.g. [b'\\n\\n'], not one string")
    for e in eos:
        if not isinstance(e, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"eos must be a list of byte strings, e.g. [b'\\n\\n'], got {e!r} in it"
            )
    wanted = {bytes(e) for e in eos}
    if b"" in wanted:
        # Every unused or special id without bytes is spelled b"": their mass is no EOS.
        raise ValueError("an EOS byte string must not be empty (b'' spells no token)")
    ids = [i for i, tok in enumerate(vocab.tokens) if tok in wanted]
    missing = wanted - {vocab.tokens[i] for i in ids}
    if missing:
        raise ValueError(
            f"no token of the vocabulary is spelled {sorted(missing)[0]!r}; "
            "an EOS byte string must be the exact bytes of a token"
        )
    return tuple(ids)
