"""Which vLLM request serves which context: requests kept alive across SMC steps.

Without sessions, every row request is a new vLLM request holding its whole context, so
each particle pays vLLM's admission of a request at every step (input processing, block
hashes, a prefix-cache lookup, the persistent batch's add and remove, output
processing): on an H200 that host time made a 64-particle step 5.7x slower than
genlm-backend 0.3.1's (``benchmarks/results/gpu.md``).

vLLM's streaming-input sessions (*resumable* requests, vLLM 0.26 to 0.33) keep a request
in the engine between inputs: each input carries only the tokens that extend what the
session has consumed, and the token the session sampled last is dropped, exactly an SMC
step's shape. This module decides, for each batch, which context feeds which session; it
knows nothing of vLLM (the model feeds the engine, :mod:`._model`).

The rules:

* A session is keyed by (variant, the exact tokens it has consumed). A context that
  extends a session's tokens by 1 to :data:`MAX_EXTENSION` tokens feeds it those tokens.
* A session serves at most one context per batch. After resampling, particles sharing
  a parent's context fork: the first feeds the parent's session, the others start new
  sessions on their whole context (prefix-cached by vLLM).
* A waiting session keeps its KV blocks and one of the engine's request slots
  (``max_num_seqs``): live sessions are capped (least recently used evicted first) at
  half the slots and half the KV cache (each session's blocks counted whole, shared
  prefixes included: an overestimate). Past the caps a context runs as a one-off
  request, as without sessions, and idle sessions that may go (next rule) are evicted
  until the batch's one-offs have a slot each (else they would wait for the slots the
  sessions leave). The caps are not a guarantee (a long one-off may need more blocks than the
  waiting sessions leave): the model ends waiting sessions when the engine finds no room
  to run a batch.
* A session is evicted, for a new session or for a one-off's slot, only once it has
  missed its turn. The *period* is the most batches seen lately between two inputs of
  one session: 1 when each step is one batch, where a session idle for one batch has
  missed its turn. With several batches a step, a session must be idle for more than the
  period, since a particle may land in a later batch of its step than its session's last
  input did. A step whose particles exceed the cap and arrive in several batches would
  otherwise evict, batch after batch, the sessions the batch before fed, so that no
  session was ever fed again (least recently used is the worst rule for a cycle longer
  than the cache). Instead the sessions the cap holds are fed every step and the rest
  run as one-offs; one-offs left without a slot wait for one (the sessions hold at most
  half of them). Before any session has been fed the period is not known: only sessions
  idle for :data:`MAX_IDLE_BATCHES` batches are evicted then, and a period counts for no
  more than that (one long-idle session fed again must not keep the table from new work
  for as long).
* A batch that fails ends every session it fed (their state in the engine is unknown).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence

import attrs

#: The most tokens one input may add to a session (how far back a context's prefixes are
#: looked up): an SMC step adds one, a byte-level model's step a few.
MAX_EXTENSION = 8

#: The batches after which an idle session may be evicted for a new one while no
#: session has been fed yet (the period is not known).
MAX_IDLE_BATCHES = 64

#: How many recent feeding batches the period is taken over (its maximum): a step cut
#: into a varying number of batches must not make the period look shorter than it is.
PERIOD_WINDOW = 8

_ids = itertools.count()


@attrs.define(eq=False)
class Session:
    """One live resumable vLLM request."""

    #: The request id we gave vLLM (its external id).
    key: str
    #: The adapter of every input (None: the base model).
    variant: Hashable
    #: The tokens the engine has consumed for it so far (its whole context).
    tokens: tuple[int, ...]
    #: vLLM's internal request id, set when its first input is admitted.
    internal_id: str | None = None
    #: Set once it is aborted in the engine: it is never fed or kept again.
    ended: bool = False
    #: The table's batch count when its last input was consumed.
    fed_at: int = 0


@attrs.frozen
class Feed:
    """How one context of a batch reaches the engine."""

    #: The session it feeds; None for a one-off request (no session).
    session: Session | None
    #: The tokens this input carries: the whole context for a new session or a one-off
    #: request, the extension for an existing session.
    tokens: tuple[int, ...]
    #: Whether this input starts its session.
    first: bool = False


class SessionTable:
    """The live sessions of one engine, least recently used first.

    Used on the model's worker thread only (no lock).

    Args:
        max_sessions: the most sessions alive at once (>= 0; 0 turns sessions off).
        max_tokens: the most KV-cache tokens all live sessions may hold (None: no limit),
            each session's counted in whole blocks of ``block_size``.
        block_size: the KV cache's block size in tokens.
        slots: the engine's request slots, which live sessions and a batch's one-off
            requests share (None: no limit).
    """

    def __init__(
        self,
        max_sessions: int,
        max_tokens: int | None = None,
        block_size: int = 1,
        slots: int | None = None,
    ):
        if max_sessions < 0:
            raise ValueError(f"max_sessions must be >= 0, got {max_sessions}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.max_sessions = max_sessions
        self.max_tokens = max_tokens
        self.block_size = block_size
        self.slots = slots
        #: Live sessions by their key, least recently used first.
        self._lru: OrderedDict[str, Session] = OrderedDict()
        #: Live sessions by (variant, length, last token): a lookup hashes no context (a
        #: context of thousands of tokens costs a pass to hash); a candidate is then
        #: compared whole, which passes over the ids only where the session matches.
        self._index: dict[tuple[Hashable, int, int], list[Session]] = {}
        self._tokens = 0
        #: Batches planned so far (the clock of ``Session.fed_at``).
        self._batches = 0
        #: For each of the last feeding batches, the most batches one of its sessions had
        #: waited since its input before.
        self._gaps: deque[int] = deque(maxlen=PERIOD_WINDOW)

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def held_tokens(self) -> int:
        """The KV-cache tokens all live sessions hold, each in whole blocks."""
        return self._tokens

    def _cost(self, length: int) -> int:
        """The KV-cache tokens a session of ``length`` tokens holds: whole blocks."""
        return -(-length // self.block_size) * self.block_size

    @property
    def period(self) -> int | None:
        """The most batches between two inputs of one session lately (see the module's
        rules); None before any session was fed."""
        return max(self._gaps) if self._gaps else None

    def sessions(self) -> list[Session]:
        """Every live session, least recently used first."""
        return list(self._lru.values())

    def _holding(self, variant: Hashable, tokens: tuple[int, ...]) -> list[Session]:
        """The live sessions of ``variant`` whose tokens are ``tokens`` (at most one)."""
        candidates = self._index.get((variant, len(tokens), tokens[-1]), ()) if tokens else ()
        return [s for s in candidates if s.tokens == tokens]

    def _extended(
        self, variant: Hashable, context: tuple[int, ...], claimed: set[str]
    ) -> tuple[Session, int] | None:
        """The unclaimed live session that ``context`` extends by the fewest tokens (1 to
        :data:`MAX_EXTENSION`), and by how many; None if there is none."""
        n = len(context)
        for k in range(1, min(MAX_EXTENSION, n - 1) + 1):
            for session in self._index.get((variant, n - k, context[n - k - 1]), ()):
                if session.key not in claimed and context[: n - k] == session.tokens:
                    return session, k
        return None

    def plan(
        self, contexts: Sequence[tuple[int, ...]], variant: Hashable
    ) -> tuple[list[Feed], list[Session]]:
        """How each of a batch's distinct contexts reaches the engine.

        Returns:
            One :class:`Feed` per context, in order, and the sessions evicted to make room
            (already out of the table; the caller aborts them in the engine before it
            admits the batch's inputs).
        """
        self._batches += 1
        feeds: list[Feed | None] = [None] * len(contexts)
        claimed: set[str] = set()
        for i, context in enumerate(contexts):
            if self._holding(variant, context):
                # A session holds this very context: it cannot be fed nothing, and a second
                # session holding it would be ambiguous. A one-off request leaves it be.
                feeds[i] = Feed(None, context)
                continue
            found = self._extended(variant, context, claimed)
            if found is not None:
                session, k = found
                claimed.add(session.key)
                feeds[i] = Feed(session, context[-k:])
        evicted: list[Session] = []
        live = len(self._lru)
        tokens = self._tokens + sum(
            self._cost(len(f.session.tokens) + len(f.tokens)) - self._cost(len(f.session.tokens))
            for f in feeds
            if f is not None and f.session is not None
        )
        # A session fed at or before ``missed`` has missed its turn (a period read from one
        # long-idle session fed again counts no more than MAX_IDLE_BATCHES); only those may
        # go, least recently fed first.
        period = self.period
        turn = MAX_IDLE_BATCHES if period is None else min(period + (period > 1), MAX_IDLE_BATCHES)
        missed = self._batches - turn
        idle = (s for s in list(self._lru.values()) if s.key not in claimed and s.fed_at <= missed)
        for i, context in enumerate(contexts):
            if feeds[i] is not None:
                continue
            cost = self._cost(len(context))
            if not self._fits(1, cost):  # too large even alone: evict nothing
                feeds[i] = Feed(None, context)
                continue
            while not self._fits(live + 1, tokens + cost):
                victim = next(idle, None)
                if victim is None:
                    break
                self.discard([victim])
                evicted.append(victim)
                live -= 1
                tokens -= self._cost(len(victim.tokens))
            if self._fits(live + 1, tokens + cost):
                session = Session(f"genlm-session-{next(_ids)}", variant, ())
                claimed.add(session.key)
                feeds[i] = Feed(session, context, first=True)
                live += 1
                tokens += cost
            else:
                feeds[i] = Feed(None, context)
        if self.slots is not None:  # a slot for each one-off, where idle sessions can go
            one_offs = sum(f.session is None for f in feeds)  # type: ignore[union-attr]
            # Only sessions that missed their turn make way, as for a new session: a batch of
            # one-offs would otherwise evict the sessions the batch before fed (one-offs left
            # without a slot wait for one; sessions hold at most half of them).
            while live + one_offs > self.slots and (victim := next(idle, None)) is not None:
                self.discard([victim])
                evicted.append(victim)
                live -= 1
        return feeds, evicted  # type: ignore[return-value] - every entry set above

    def _fits(self, sessions: int, tokens: int) -> bool:
        return sessions <= self.max_sessions and (
            self.max_tokens is None or tokens <= self.max_tokens
        )

    def commit(self, feeds: Sequence[Feed]) -> None:
        """Record that every session of ``feeds`` has consumed its input: each now holds its
        context and is the most recently used (a session ended meanwhile is left out)."""
        gap = 0
        for feed in feeds:
            session = feed.session
            if session is None or session.ended:
                continue
            if not feed.first:
                gap = max(gap, self._batches - session.fed_at)
            session.fed_at = self._batches
            self.discard([session])
            session.tokens += feed.tokens
            self._lru[session.key] = session
            index = (session.variant, len(session.tokens), session.tokens[-1])
            self._index.setdefault(index, []).append(session)
            self._tokens += self._cost(len(session.tokens))
        if gap:
            self._gaps.append(gap)

    def discard(self, sessions: Sequence[Session]) -> None:
        """Forget ``sessions`` (ended in the engine, or about to be)."""
        for session in sessions:
            if self._lru.pop(session.key, None) is None:
                continue
            index = (session.variant, len(session.tokens), session.tokens[-1])
            same = self._index[index]
            same.remove(session)
            if not same:
                del self._index[index]
            self._tokens -= self._cost(len(session.tokens))

    def take_all(self) -> list[Session]:
        """Forget every session; the ones that were live (for the caller to abort)."""
        sessions = list(self._lru.values())
        self._lru.clear()
        self._index.clear()
        self._tokens = 0
        return sessions
