"""The published genlm-bytes 0.2 beam (``genlm.bytes.byte_lm.beam``): ``BeamParams`` and
``ByteBeamState``, over the byte model's own beam.

Programs written for the published API (genlm-control's ``ByteLLM``) build a ``BeamParams``
and call ``ByteBeamState.initial``; ``BeamParams`` maps onto :class:`genlm.bytes.ByteLM`'s
options, and ``ByteBeamState`` is :class:`genlm.bytes.BeamState` with 0.2's pruning (only in
``prune()``) and 0.2's extra methods. Everything is computed by the beam underneath.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from genlm.bytes._aliases import either_byte_strings
from genlm.bytes._beam import BeamState
from genlm.bytes._dist import NextByteLogprobs
from genlm.bytes._model import ByteModel, check_beam_options, log_threshold
from genlm.bytes._types import Candidate
from genlm.bytes.byte_lm.trie_state import LazyTrieState, TrieMode, bos_token

__all__ = ["BeamParams", "ByteBeamState"]


class _HeldEos(set):
    """The EOS strings as a :class:`BeamParams` holds them, under both its names.

    The type marks a value read back from a ``BeamParams``: ``dataclasses.replace(params,
    eos_byte_strings=...)`` passes the other name (``eos_tokens``) as read, and that value
    yields to the one given fresh, so ``replace`` changes the EOS strings by either name.
    """

    def __repr__(self) -> str:
        return repr(set(self))


@dataclasses.dataclass
class BeamParams:
    """Options of the byte-level beam, by the published genlm-bytes 0.2 names.

    A stdlib dataclass, as documented (and as 0.2.0's is): ``dataclasses.replace``,
    ``asdict``, ``fields`` work on it, and a replaced copy is checked again.

    Args:
        K: beam width, candidates kept before each step (None: no limit, exact).
        prune_threshold: also drop candidates whose share of the beam's mass is at most
            this; in [0, 1).
        verbose: log each new beam (logger ``genlm.bytes._beam``, level INFO).
        eos_tokens: byte strings whose tokens end the sequence (``b"<|endoftext|>"``,
            ``b"\\n\\n"``). None or empty: no token ends it (no EOS mass), as documented.
        heal: adaptive token healing when no candidate can take the next byte.
        heal_max_backoff: most bytes moved out of a partial token when healing (None: all).
        heal_max_splits: most extra tokens committed inside the moved bytes (None: no limit).
        eos_byte_strings: the same as ``eos_tokens`` (genlm-bytes 0.2.0's released name, used
            by genlm-control 0.4.1); give one of the two, or both equal. Both attributes
            then hold the same set (empty for none); a value read back from a
            ``BeamParams`` yields to one given under the other name (``replace``). None
            means "not given", so ``replace(params, eos_tokens=None)`` keeps the EOS
            strings; ``replace(params, eos_tokens=set())`` clears them.

    Bad values raise when the parameters are built, as ``ByteLM`` would: ``ValueError``
    (also for ``eos_tokens`` and ``eos_byte_strings`` that differ), ``TypeError`` for an
    EOS string that is not bytes or one string instead of a list. Values assigned later
    are not checked.
    """

    K: int | None
    prune_threshold: float = 0.0
    verbose: bool = False
    eos_tokens: set[bytes] | None = None
    heal: bool = True
    heal_max_backoff: int | None = None
    heal_max_splits: int | None = None
    eos_byte_strings: set[bytes] | None = None

    def __post_init__(self) -> None:
        check_beam_options(
            self.K, self.prune_threshold, self.heal_max_backoff, self.heal_max_splits
        )
        given, released = self.eos_tokens, self.eos_byte_strings
        if isinstance(given, _HeldEos) and not isinstance(released, (_HeldEos, type(None))):
            given = None
        if isinstance(released, _HeldEos) and not isinstance(given, (_HeldEos, type(None))):
            released = None
        merged = either_byte_strings("eos_tokens", given, "eos_byte_strings", released)
        self.eos_tokens = self.eos_byte_strings = _HeldEos(merged or ())

    @property
    def log_prune_threshold(self) -> float:
        """``log(prune_threshold)``, -inf for 0."""
        return log_threshold(self.prune_threshold)

    def byte_lm_options(self) -> dict[str, Any]:
        """The keyword options of :class:`genlm.bytes.ByteLM` these parameters mean."""
        return {
            "K": self.K,
            "prune_threshold": self.prune_threshold,
            "eos": sorted(self.eos_tokens or ()),
            "heal": self.heal,
            "heal_max_backoff": self.heal_max_backoff,
            "heal_max_splits": self.heal_max_splits,
            "verbose": self.verbose,
        }


class ByteBeamState(BeamState):
    """The byte-level beam as genlm-bytes 0.2 offers it: a :class:`genlm.bytes.BeamState`
    that prunes only when asked.

    ``advance`` (``<<``) and ``logp_next`` use every candidate the state holds; only
    :meth:`prune` drops (genlm-control's ``ByteLLM`` prunes before each byte and asks
    ``logp_next`` of the unpruned beam after it, which can hold up to twice ``K``).
    Prefill prunes before every byte, as the beam's does. Make one with :meth:`initial`,
    which needs a vocabulary with a BOS token and takes the published API's trie options:
    ``max_batch_size`` and ``device`` are accepted and have no effect (the token model's
    scheduler batches; the trie runs on the CPU), anything else raises ``TypeError``.

    ``ByteBeamState(states, params)``, as documented, makes a beam of candidates of an
    existing one (``ByteBeamState(list(beam)[:1], beam.params)``): ``states`` are
    :class:`LazyTrieState` of one beam's model, in one mode, after the same bytes (a
    ``TypeError`` or ``ValueError`` says which is not). ``params`` must be the options
    that model was made with (``beam.params``, or equal to the ``initial`` ones): the
    options are the model's, fixed by :meth:`initial`, so others raise ``ValueError``.
    At least one state is needed, as the model comes from the states.
    """

    def __init__(self, states: Iterable[LazyTrieState], params: BeamParams):
        states = list(states)
        if not isinstance(params, BeamParams):
            raise TypeError(f"params must be a BeamParams, got {params!r}")
        if not states:
            raise ValueError(
                "ByteBeamState(states, params) needs at least one state (its model comes from "
                "them); start a beam with ByteBeamState.initial(llm, params)"
            )
        for state in states:
            if not isinstance(state, LazyTrieState):
                raise TypeError(
                    f"states must be LazyTrieState (the candidates of a beam: list(beam)), "
                    f"got {state!r}"
                )
        first = states[0]
        for state in states[1:]:
            if state.byte_lm is not first.byte_lm:
                raise ValueError("the states belong to beams of different models")
            if state.eos_mode != first.eos_mode:
                raise ValueError("the states are in different modes (TrieMode); use with_mode")
            if state.data != first.data:
                raise ValueError(
                    f"the states are after different bytes ({first.data!r}, {state.data!r})"
                )
        own = _params_of(first.byte_lm)
        if params != own:
            differ = [
                f"{f.name}={getattr(params, f.name)!r} (the model's: {getattr(own, f.name)!r})"
                for f in dataclasses.fields(BeamParams)
                if getattr(params, f.name) != getattr(own, f.name) and f.name != "eos_byte_strings"
            ]
            raise ValueError(
                f"params differ from the options the states' model was made with: "
                f"{', '.join(differ)}; a beam's options are fixed by ByteBeamState.initial, "
                "so pass beam.params, or start a beam with these params there"
            )
        super().__init__(first.byte_lm, [s.candidate for s in states], first.data, first.eos_mode)

    @classmethod
    def _make(
        cls,
        byte_lm: ByteModel,
        candidates: Sequence[Candidate],
        data: bytes = b"",
        eos_mode: bool = True,
    ) -> ByteBeamState:
        """A state from :class:`BeamState`'s arguments, past the documented constructor."""
        state = cls.__new__(cls)
        BeamState.__init__(state, byte_lm, candidates, data, eos_mode)
        return state

    @classmethod
    async def initial(
        cls, llm: Any, params: BeamParams, trie_opts: dict[str, Any] | None = None
    ) -> ByteBeamState:
        """The state at a token boundary right after the BOS token of ``llm`` (a genlm-core
        ``AsyncLM``; ``genlm.backend``'s models are ones), with the LM's row after BOS
        fetched, as 0.2.0's ``initial`` materializes it.

        That fetch is also an await before the beam exists: genlm-control's ``ByteLLM``
        stores the beam ``initial`` returns, then prefills its prompt, so its concurrent
        first calls (an SMC step's particles) must all be waiting here, not find the stored
        beam before the prompt is in it.
        """
        unknown = set(trie_opts or ()) - {"max_batch_size", "device"}
        if unknown:
            raise TypeError(f"unknown trie option(s) {sorted(unknown)}")
        model = ByteModel(llm, **params.byte_lm_options())
        bos = bos_token(llm)
        state = cls.at_context(model, (bos,))
        [start] = await model.next_tokens([(bos,)], state.eos_mode)
        return state._derive([Candidate((bos,), 0.0, model.trie.root, start, 0.0)])

    async def advance(self, byte: int, prune: bool = False) -> ByteBeamState:
        """:meth:`BeamState.advance`, from this beam as it is unless ``prune``."""
        return await super().advance(byte, prune)

    async def logp_next(self, prune: bool = False) -> NextByteLogprobs:
        """:meth:`BeamState.logp_next`, on this beam as it is unless ``prune``."""
        return await super().logp_next(prune)

    @property
    def params(self) -> BeamParams:
        """The beam's options by the published names: a new :class:`BeamParams` equal to
        the one :meth:`initial` was given (the options are the model's; changing this
        object changes no beam)."""
        return _params_of(self.byte_lm)

    @property
    def states(self) -> list[LazyTrieState]:
        """The candidates as :class:`LazyTrieState` views, heaviest first."""
        return [LazyTrieState(self.byte_lm, c, self.eos_mode, self.data) for c in self.candidates]

    def __iter__(self) -> Iterator[LazyTrieState]:
        return iter(self.states)

    async def extend(self, logZ: float | None = None) -> list[LazyTrieState]:
        """The candidates that complete their partial token here, at the new boundary.

        Each whole token a candidate's partial bytes spell is committed (every id with
        those bytes); those whose share of ``logZ`` plus the new boundaries' mass is at
        most the prune threshold (``logZ`` defaults to :attr:`logZ`) are dropped. Their
        next-token masses are fetched (one LM batch); candidates already at a boundary are
        not repeated.
        """
        found = self._boundary_contexts(logZ, roots=False)
        nexts = await self.byte_lm.next_tokens([ctx for ctx, _ in found], self.eos_mode)
        root = self.byte_lm.trie.root
        return [
            LazyTrieState(self.byte_lm, Candidate(ctx, w, root, n, w), self.eos_mode, self.data)
            for (ctx, w), n in zip(found, nexts)
        ]

    def with_mode(self, mode: TrieMode) -> ByteBeamState:
        """The same candidates in ``mode`` (a :class:`TrieMode` or its value), as genlm-bytes
        0.2 switches: each keeps the masses it has, and only masses fetched from now on
        (new token boundaries) count EOS tokens as ``mode`` says. So a token begun as text
        may still complete as text. (:meth:`BeamState.with_eos_mode` recomputes instead.)"""
        return self._derive(self.candidates, eos_mode=TrieMode(mode) is TrieMode.WITH_EOS)

    def _end_prefill(self) -> ByteBeamState:
        """genlm-bytes 0.2's end of :meth:`prefill`: :meth:`with_mode` to EOS mode, the
        masses kept (an EOS token the prompt began, or spelled whole, stays text)."""
        return self.with_mode(TrieMode.WITH_EOS)

    async def cleanup(self) -> None:
        """Release the model's caches (shared by all its states), as genlm-bytes 0.2's
        releases its trie's task: the states stay usable, the caches fill again on use."""
        self.byte_lm.clear_cache()


def _params_of(model: ByteModel) -> BeamParams:
    """The :class:`BeamParams` that mean ``model``'s options (its EOS ids as byte strings)."""
    return BeamParams(
        K=model.K,
        prune_threshold=model.prune_threshold,
        verbose=model.verbose,
        eos_tokens={model.lm.vocab.tokens[i] for i in model.eos_ids},
        heal=model.heal,
        heal_max_backoff=model.heal_max_backoff,
        heal_max_splits=model.heal_max_splits,
    )
