"""``NextByteLogprobs``: what a byte-level state predicts for the next symbol."""

from __future__ import annotations

import attrs
import numpy as np

from genlm.bytes._chart import Chart
from genlm.core import EOS_EDGE
from genlm.core.backend import check_temperature, checked_count

EOS = EOS_EDGE
"""Index of end-of-sequence in :attr:`NextByteLogprobs.logprobs` (256: one past the last
byte, the same label as the trie's EOS edge): ``dist[EOS]``, and what
:meth:`NextByteLogprobs.sample` returns when the sequence ends."""

EOT = 257
"""Key of the end-of-token (token boundary) probability: ``dist[EOT]``. It is not an
outcome that competes with the bytes and EOS; see :class:`NextByteLogprobs`."""


def is_index(value: object, stop: int) -> bool:
    """Whether ``value`` is an integer (a Python or numpy one, not a bool) in ``range(stop)``:
    the one test of a byte value (``stop`` 256) or a symbol key, so every entry point takes
    the same values (numpy would read a float or a bool as an index, or fail in its words)."""
    integer = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    return integer and 0 <= value < stop


def checked_rng(rng: object) -> np.random.Generator:
    """``rng``, if it draws as the samplers do, with ``rng.choice(n, p=...)``: a numpy
    ``Generator``, a legacy ``RandomState``, or any object with that method (anything else
    failed at the first draw, as ``'int' object has no attribute 'choice'``).

    Raises:
        TypeError: it has no ``choice`` method (None included: make a generator with
            ``numpy.random.default_rng(seed)``).
    """
    if not callable(getattr(rng, "choice", None)):
        raise TypeError(
            "rng must be a numpy.random.Generator (numpy.random.default_rng(seed)) or have "
            f"its choice method, got {rng!r}"
        )
    return rng


def logsumexp(x: np.ndarray) -> float:
    """``log(sum(exp(x)))`` in float64; -inf for an empty or all -inf ``x``."""
    m = float(np.max(x)) if len(x) else -np.inf
    if not np.isfinite(m):
        return m
    return m + float(np.log(np.exp(x - m).sum()))


@attrs.frozen(eq=False)
class NextByteLogprobs:
    """Log-probabilities of what follows the bytes consumed so far.

    ``logprobs[b]`` for ``b < 256`` is ``log P(x + b) - log P(x)`` and ``logprobs[EOS]`` is
    ``log P(x, then EOS) - log P(x)``, where ``P(x)`` is the probability that the byte
    stream starts with ``x``. These are the exact conditionals of the token LM when the
    beam is not pruned, so chaining them gives the prefix probability. They sum to at
    most 1: the rest is the mass of the tokens that spell no bytes and are not EOS
    (special tokens such as ``<unk>`` and ``<s>``, a model's padding ids, any empty token).
    :meth:`normalized` renormalizes for sampling.

    ``log_eot`` (also ``dist[EOT]``) is ``log P(a token ends exactly at the end of x | x)``:
    the probability that the next byte starts a new token. It overlaps the byte outcomes
    (each byte can come from inside a token or after a boundary), so it is reported
    beside them, not among them.

    Symbols are byte values 0..255 and :data:`EOS`; ties (``argmax``, ``top``) go to the
    lowest. :meth:`sample` draws from the bytes and EOS renormalized over them, with the
    ``temperature`` dividing the log-probabilities (0 is :meth:`argmax`, no draw); it
    refuses what :func:`genlm.core.backend.check_temperature` refuses, and a state where
    no byte and no EOS has positive probability (``ValueError``).
    """

    #: shape (257,), float64: bytes 0..255 then EOS.
    logprobs: np.ndarray
    #: log-probability of a token boundary at the current position.
    log_eot: float

    def __getitem__(self, key: int) -> float:
        """``dist[b]``: the log-probability of byte ``b``, of :data:`EOS`, or of :data:`EOT`.

        Raises:
            KeyError: ``key`` is none of those (an int out of range, a float, a string).
        """
        if not is_index(key, EOT + 1):
            raise KeyError(f"expected a byte 0..255, EOS ({EOS}) or EOT ({EOT}), got {key!r}")
        return self.log_eot if key == EOT else float(self.logprobs[key])

    @property
    def eos(self) -> float:
        """Log-probability of ending the sequence here."""
        return float(self.logprobs[EOS])

    @property
    def log_total(self) -> float:
        """Log of the total over bytes and EOS (0 unless mass goes to other special tokens)."""
        return logsumexp(self.logprobs)

    @property
    def ps(self) -> np.ndarray:
        """The published genlm-bytes 0.2 layout, shape (258,), float64: log-probabilities of
        bytes 0..255, then end of token (index 256: always -inf, as there), then EOS
        (index 257, also ``ps[-1]``), normalized over bytes and EOS."""
        out = np.full(SYMBOLS, -np.inf)
        norm = self.normalized()
        out[:256] = norm[:256]
        out[EOS_INDEX] = norm[EOS]
        return out

    def materialize(self) -> Chart:
        """:attr:`ps` as genlm-bytes 0.2's ``LazyByteProbs.materialize`` gives it (see
        :meth:`LazyByteProbs.materialize`; ``dist[EOS]`` here is ``materialize()[257]``)."""
        return LazyByteProbs(self.ps).materialize()

    def pretty(self) -> Chart:
        """:meth:`materialize` with readable keys, as 0.2's ``pretty`` (see
        :meth:`LazyByteProbs.pretty`)."""
        return LazyByteProbs(self.ps).pretty()

    def normalized(self) -> np.ndarray:
        """The distribution to sample from: ``logprobs - log_total`` (an all -inf row gives NaN)."""
        return self.logprobs - self.log_total

    def argmax(self) -> int:
        """The most likely next symbol."""
        return int(np.argmax(self.logprobs))

    def tempered(self, temperature: float = 1.0) -> np.ndarray:
        """Log-probabilities of the distribution :meth:`sample` draws from at
        ``temperature`` (float64, over bytes and EOS): :meth:`normalized` at 1, the
        log-probabilities divided by ``temperature`` and renormalized otherwise, and at 0
        (the argmax, no draw) 0 for the argmax and -inf for the rest. What a proposal's
        importance weight needs.

        Raises:
            ValueError: a temperature :func:`genlm.core.backend.check_temperature` refuses,
                or no byte and no EOS has positive probability here.
        """
        scaled = self._scaled(temperature)
        if scaled is None:
            out = np.full(len(self.logprobs), -np.inf)
            out[self.argmax()] = 0.0
            return out
        return scaled - logsumexp(scaled)

    def sample(self, rng: np.random.Generator, temperature: float = 1.0) -> int:
        """Draw the next symbol with ``rng``, a numpy ``Generator`` (see the class and
        :func:`checked_rng`)."""
        checked_rng(rng)
        scaled = self._scaled(temperature)
        if scaled is None:
            return self.argmax()
        p = np.exp(scaled)
        return int(rng.choice(len(p), p=p / p.sum()))

    def _scaled(self, temperature: float) -> np.ndarray | None:
        """The log-probabilities shifted to a maximum of 0, then divided by ``temperature``
        (None at 0: greedy, no draw), after the checks :meth:`sample` and :meth:`tempered`
        share. Shifting first, as core's sampler does, makes a tiny temperature send only
        the others to -inf (probability below float64's range), never all."""
        temperature = check_temperature(temperature)
        best = float(np.max(self.logprobs))
        if not np.isfinite(best):
            raise ValueError("no byte and no EOS has positive probability here")
        if temperature == 0:
            return None
        with np.errstate(over="ignore"):
            return (self.logprobs - best) / temperature

    def top(self, k: int = 10) -> list[tuple[int, float]]:
        """Up to ``k`` pairs ``(symbol, logprob)``, best first; impossible symbols left out.

        Raises:
            TypeError, ValueError: ``k`` is not an integer >= 0 (a negative one sliced all
                but the last symbols).
        """
        k = checked_count("k", k, 0)
        order = np.argsort(-self.logprobs, kind="stable")[:k]
        return [(int(i), float(self.logprobs[i])) for i in order if np.isfinite(self.logprobs[i])]

    def __repr__(self) -> str:
        shown = ", ".join(f"{_label(i)}: {p:.3f}" for i, p in self.top(5))
        return f"NextByteLogprobs({shown}, EOT: {self.log_eot:.3f})"


#: Indices of the published 0.2 API's next-symbol arrays (``LazyByteProbs.ps``): 256
#: bytes, then end of token (a token boundary here), then end of sequence. Not this
#: package's own numbering (:data:`EOS` 256, :data:`EOT` 257).
EOT_INDEX = 256
EOS_INDEX = 257
SYMBOLS = 258

#: The keys of :meth:`LazyByteProbs.materialize` and ``pretty``, one per entry of ``ps``.
_PS_KEYS: list[int | None] = [*range(256), None, EOS_INDEX]
_PRETTY_KEYS: list[bytes | str] = [*(bytes([b]) for b in range(256)), "EOT", "EOS"]


@attrs.frozen
class LazyByteProbs:
    """Next-symbol log-probabilities in genlm-bytes 0.2's layout, as its ``LazyByteProbs``:
    what :attr:`LazyTrieState.logp_next <genlm.bytes.LazyTrieState.logp_next>` returns, so
    0.2 programs reading ``state.logp_next.ps`` (as 0.2's own beam summed them) run.

    ``ps`` has shape (258,): bytes 0..255, then end of token (index 256), then EOS (257).
    ``probs[b]`` reads a byte, ``probs[None]`` the end of token, ``probs[257]`` EOS.
    """

    #: float64 log-probabilities, 0.2's layout.
    ps: np.ndarray = attrs.field(converter=lambda ps: np.asarray(ps, dtype=np.float64))

    def __attrs_post_init__(self) -> None:
        if self.ps.shape != (SYMBOLS,):
            raise ValueError(
                f"expected {SYMBOLS} log-probabilities (bytes, EOT, EOS), got {self.ps.shape}"
            )

    def __getitem__(self, key: int | None) -> float:
        """The log-probability of byte ``key`` (0..255), of the end of token (None, or its
        index 256) or of EOS (257), as 0.2 reads them.

        Raises:
            ValueError: any other key (0.2's error for an index past 257).
        """
        if key is None:
            return float(self.ps[EOT_INDEX])
        if is_index(key, len(self.ps)):
            return float(self.ps[key])
        raise ValueError(
            f"expected a byte 0..255, None or 256 (end of token) or 257 (EOS), got {key!r}"
        )

    def materialize(self) -> Chart:
        """A :class:`Chart` of the log-probabilities (``zero`` -inf) keyed by byte value
        0..255, ``None`` for end of token and 257 for EOS (0.2's keys)."""
        return Chart(-np.inf, zip(_PS_KEYS, self.ps.tolist()))

    def pretty(self) -> Chart:
        """:meth:`materialize` with readable keys, as 0.2's ``pretty``: each byte as
        ``bytes`` (``b"a"``), ``"EOT"`` and ``"EOS"``; ``print`` it to list the possible
        symbols, most likely first."""
        return Chart(-np.inf, zip(_PRETTY_KEYS, self.ps.tolist()))


def _label(symbol: int) -> str:
    """A readable name of a symbol: the byte as Python shows it, or ``EOS``."""
    return "EOS" if symbol == EOS else repr(bytes([symbol]))[1:]
