"""``Chart``: genlm-bytes 0.2's documented dict of weights with a default value.

What ``NextByteLogprobs.materialize`` and ``pretty`` return, as 0.2's ``LazyByteProbs``
did; programs written for 0.2 print, compare and rank next-byte distributions with it.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any


class Chart(dict):
    """A dict whose missing keys read as ``zero`` (the weight of an impossible outcome:
    ``0.0`` for probabilities, ``-inf`` for log-probabilities), with the operations the
    published genlm-bytes 0.2 documents.

    Args:
        zero: the value of every key not in the chart.
        vals: initial entries, a mapping or ``(key, value)`` pairs.

    Entries equal to ``zero`` may be stored; ``repr``, ``str`` and :meth:`trim` leave them
    out. Every method returns a new chart (with the same ``zero`` unless it says otherwise)
    and leaves this one as it is.
    """

    def __init__(self, zero: Any, vals: Mapping[Hashable, Any] | Iterable[tuple] = ()):
        super().__init__(vals)
        self.zero = zero

    def __missing__(self, key: Hashable) -> Any:
        return self.zero

    def spawn(self) -> Chart:
        """An empty chart with this one's ``zero``."""
        return Chart(self.zero)

    def __add__(self, other: Mapping[Hashable, Any]) -> Chart:
        """Entry-wise sum over the keys of both."""
        out = self.copy()
        for key, value in other.items():
            out[key] += value
        return out

    def __mul__(self, other: Mapping[Hashable, Any]) -> Chart:
        """Entry-wise product over this chart's keys (``other``'s missing keys read as its
        zero, if it is a chart); products equal to ``zero`` are left out."""
        out = self.spawn()
        for key, value in self.items():
            product = value * other[key]
            if product != self.zero:
                out[key] = product
        return out

    def copy(self) -> Chart:
        """A shallow copy, a chart with the same ``zero``."""
        return Chart(self.zero, self)

    def trim(self) -> Chart:
        """The entries that are not ``zero``."""
        return Chart(self.zero, self._nonzero())

    def _nonzero(self) -> dict:
        return {key: value for key, value in self.items() if value != self.zero}

    def metric(self, other: Chart) -> Any:
        """The largest absolute difference between the two charts, over both's keys (equal
        entries differ by 0, -inf ones included)."""
        if not isinstance(other, Chart):
            raise TypeError(f"metric compares two charts, got {type(other).__name__}")
        return max((_difference(self[k], other[k]) for k in self.keys() | other.keys()), default=0)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(repr(k))}</td><td>{html.escape(str(v))}</td></tr>"
            for k, v in self._nonzero().items()
        )
        return (
            '<div style="font-family: Monospace;"><table>'
            f"<tr><th>key</th><th>value</th></tr>{rows}</table></div>"
        )

    def __repr__(self) -> str:
        return repr(self._nonzero())

    def __str__(self, style_value: Callable[[Hashable, Any], str] = lambda k, v: str(v)) -> str:
        """One line per entry that is not ``zero``, largest value first."""
        entries = sorted(self._nonzero().items(), key=lambda kv: -kv[1])
        body = "\n".join(f"  {k!r}: {style_value(k, v)}," for k, v in entries)
        return "Chart {\n" + body + "\n}"

    def assert_equal(
        self,
        want: Mapping[Hashable, Any],
        *,
        domain: Iterable[Hashable] | None = None,
        tol: float = 1e-5,
        verbose: bool = False,
        throw: bool = True,
    ) -> None:
        """Check each key of ``domain`` (default: both's keys) holds ``want``'s value within
        ``tol``; ``verbose`` prints every key's verdict, ``throw`` raises
        ``AssertionError`` naming the first key that differs (one of them is needed)."""
        if not (verbose or throw):
            raise ValueError("assert_equal needs verbose=True or throw=True to report anything")
        if not isinstance(want, Chart):
            want = Chart(self.zero, want)
        keys = self.keys() | want.keys() if domain is None else domain
        wrong = []
        for key in keys:
            ok = _difference(self[key], want[key]) <= tol
            if verbose:
                print("ok " if ok else "BAD", key, self[key], *(() if ok else (want[key],)))
            if not ok:
                wrong.append(key)
        if throw and wrong:
            key = wrong[0]
            raise AssertionError(f"{key!r}: {self[key]} != {want[key]} (tolerance {tol})")

    def argmax(self) -> Hashable:
        """The key of the largest value."""
        return max(self, key=self.__getitem__)

    def argmin(self) -> Hashable:
        """The key of the smallest value."""
        return min(self, key=self.__getitem__)

    def top(self, k: int) -> Chart:
        """The ``k`` entries of largest value, largest first."""
        return Chart(self.zero, sorted(self.items(), key=lambda kv: kv[1], reverse=True)[:k])

    def max(self) -> Any:
        """The largest value."""
        return max(self.values())

    def min(self) -> Any:
        """The smallest value."""
        return min(self.values())

    def sum(self) -> Any:
        """The sum of the values."""
        return sum(self.values())

    def sort(self, **kwargs: Any) -> Chart:
        """The entries in the order of their keys (``sorted``'s ``key``/``reverse``)."""
        return Chart(self.zero, [(k, self[k]) for k in sorted(self, **kwargs)])

    def sort_descending(self) -> Chart:
        """The entries, largest value first."""
        return Chart(self.zero, sorted(self.items(), key=lambda kv: -kv[1]))

    def normalize(self) -> Chart:
        """The values divided by their sum (this chart itself when the sum is 0)."""
        total = self.sum()
        if total == 0:
            return self
        return Chart(self.zero, [(k, v / total) for k, v in self.items()])

    def filter(self, f: Callable[[Hashable], bool]) -> Chart:
        """The entries whose key ``f`` accepts."""
        return Chart(self.zero, [(k, v) for k, v in self.items() if f(k)])

    def map_values(self, f: Callable[[Any], Any]) -> Chart:
        """``f`` applied to each value, and to ``zero`` (the new chart's zero)."""
        return Chart(f(self.zero), [(k, f(v)) for k, v in self.items()])

    def map_keys(self, f: Callable[[Hashable], Hashable]) -> Chart:
        """``f`` applied to each key (a later entry wins where two keys map to one)."""
        return Chart(self.zero, [(f(k), v) for k, v in self.items()])

    def project(self, f: Callable[[Hashable], Hashable]) -> Chart:
        """``f`` applied to each key, summing the values of keys that map to one."""
        out = self.spawn()
        for key, value in self.items():
            out[f(key)] += value
        return out

    def compare(
        self, other: Mapping[Hashable, Any], *, domain: Iterable[Hashable] | None = None
    ) -> Any:
        """A ``pandas.DataFrame``, one row per key of ``domain`` (default: both's keys):
        ``key``, ``self``, ``other`` and their absolute difference ``metric``. Needs pandas
        (not a dependency of genlm-bytes)."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError("Chart.compare makes a pandas DataFrame: install pandas") from e
        if not isinstance(other, Chart):
            other = Chart(self.zero, other)
        keys = self.keys() | other.keys() if domain is None else domain
        rows = [
            {"key": k, "self": self[k], "other": other[k], "metric": _difference(self[k], other[k])}
            for k in keys
        ]
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        """The entries as a plain dict (``zero`` ones included)."""
        return dict(self)


def _difference(a: Any, b: Any) -> Any:
    """``|a - b|``, and 0 where ``a == b``: two -inf entries (an outcome impossible in both
    log-space charts) are equal, but ``-inf - -inf`` is NaN."""
    return 0 if a == b else abs(a - b)
