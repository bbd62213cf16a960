"""``genlm.bytes.Chart`` (genlm-bytes 0.2's documented class) and the 0.2 views of a
next-byte distribution built on it: ``NextByteLogprobs.materialize`` and ``pretty``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from genlm.bytes import EOS, Chart, NextByteLogprobs


def test_missing_keys_read_as_zero_and_zero_entries_are_hidden():
    """A chart is a dict whose missing keys are ``zero``; repr and str show the others."""
    c = Chart(0.0, {"a": 2.0, "b": 0.0, "c": 1.0})
    assert c["zz"] == 0.0 and "zz" not in c
    assert repr(c) == "{'a': 2.0, 'c': 1.0}"
    assert str(c) == "Chart {\n  'a': 2.0,\n  'c': 1.0,\n}"
    assert c.trim() == {"a": 2.0, "c": 1.0} and c.trim().zero == 0.0
    assert c.to_dict() == {"a": 2.0, "b": 0.0, "c": 1.0} and type(c.to_dict()) is dict
    assert "<td>&#x27;a&#x27;</td><td>2.0</td>" in c._repr_html_()
    assert "'b'" not in c._repr_html_()


def test_arithmetic_and_ranking():
    """Sums, products, ranking and reshaping, each against values worked out by hand."""
    a = Chart(0, {"x": 1, "y": 2})
    b = Chart(0, {"y": 3, "z": 4})
    assert a + b == {"x": 1, "y": 5, "z": 4}
    assert a * b == {"y": 6}  # x*0 is zero: left out
    assert a.metric(b) == 4 and a.metric(a.copy()) == 0
    with pytest.raises(TypeError, match="two charts"):
        a.metric({"x": 1})
    c = Chart(0.0, {"p": 1.0, "q": 3.0, "r": 2.0})
    assert (c.argmax(), c.argmin(), c.max(), c.min(), c.sum()) == ("q", "p", 3.0, 1.0, 6.0)
    assert list(c.top(2).items()) == [("q", 3.0), ("r", 2.0)]
    assert list(c.sort()) == ["p", "q", "r"] and list(c.sort(reverse=True)) == ["r", "q", "p"]
    assert list(c.sort_descending()) == ["q", "r", "p"]
    assert c.normalize() == {"p": 1 / 6, "q": 0.5, "r": 1 / 3}
    assert Chart(0.0, {"p": 0.0}).normalize() == {"p": 0.0}
    assert c.filter(lambda k: k != "q") == {"p": 1.0, "r": 2.0}
    logs = c.map_values(lambda v: math.log(v) if v else -math.inf)
    assert logs.zero == -math.inf and logs["q"] == math.log(3.0)
    assert c.map_keys(str.upper) == {"P": 1.0, "Q": 3.0, "R": 2.0}
    assert c.project(lambda k: k == "q") == {False: 3.0, True: 3.0}
    assert c.spawn() == {} and c.spawn().zero == 0.0


def test_assert_equal_names_the_first_key_that_differs():
    """Within ``tol`` passes; otherwise ``AssertionError`` names the key and both values."""
    c = Chart(0.0, {"a": 1.0, "b": 2.0})
    c.assert_equal({"a": 1.0 + 1e-7, "b": 2.0})
    c.assert_equal({"a": 5.0, "b": 2.0}, domain=["b"])
    with pytest.raises(AssertionError, match=r"'a': 1.0 != 1.5"):
        c.assert_equal({"a": 1.5, "b": 2.0})
    with pytest.raises(ValueError, match="verbose=True or throw=True"):
        c.assert_equal({}, throw=False)


def test_equal_minus_infinity_entries_differ_by_nothing():
    """Log-space charts hold -inf for impossible outcomes: equal -inf entries differ by 0 in
    metric (0.2.0's answers for these charts: 0 and 0.5; -inf - -inf made it NaN) and pass
    assert_equal (two materialize() of one distribution failed it, in 0.2.0 too)."""
    a, b = _dist().materialize(), _dist().materialize()
    assert a.metric(b) == 0
    a.assert_equal(b)
    c = Chart(-math.inf, {0: -math.inf, 1: -1.0})
    d = Chart(-math.inf, {0: -math.inf, 1: -1.5})
    assert c.metric(d) == 0.5 and d.metric(c) == 0.5
    assert Chart(-math.inf, {0: -math.inf}).metric(Chart(-math.inf, {0: -1.0})) == math.inf
    with pytest.raises(AssertionError, match="1: -1.0 != -1.5"):
        c.assert_equal(d)


def test_compare_is_a_table_of_both_values():
    """``compare`` gives one row per key with both values and their distance (pandas)."""
    pd = pytest.importorskip("pandas")
    df = Chart(0.0, {"a": 1.0}).compare({"a": 0.5, "b": 2.0})
    assert isinstance(df, pd.DataFrame)
    rows = {r["key"]: (r["self"], r["other"], r["metric"]) for r in df.to_dict("records")}
    assert rows == {"a": (1.0, 0.5, 0.5), "b": (0.0, 2.0, 2.0)}


def _dist() -> NextByteLogprobs:
    """P(b"\\x00") = 0.4, P(b"a") = 0.2, P(EOS) = 0.2: 0.8 in all (the rest: other specials)."""
    logprobs = np.full(EOS + 1, -np.inf)
    logprobs[0], logprobs[ord("a")], logprobs[EOS] = np.log([0.4, 0.2, 0.2])
    return NextByteLogprobs(logprobs, log_eot=np.log(0.3))


def test_materialize_is_the_0_2_layout_as_a_chart():
    """``materialize()`` is 0.2's: ``ps`` (normalized over bytes and EOS) keyed by byte
    value, ``None`` for end of token (impossible here), 257 for EOS; zero is -inf."""
    chart = _dist().materialize()
    assert isinstance(chart, Chart) and chart.zero == -np.inf and len(chart) == 258
    assert set(chart) == {*range(256), None, 257}
    assert chart.trim() == pytest.approx(
        {0: np.log(0.5), ord("a"): np.log(0.25), 257: np.log(0.25)}
    )
    assert chart[None] == -np.inf
    assert list(chart.values()) == _dist().ps.tolist()


def test_pretty_names_the_symbols():
    """``pretty()``: the same values keyed by readable names, printed most likely first."""
    chart = _dist().pretty()
    assert isinstance(chart, Chart) and chart.zero == -np.inf and len(chart) == 258
    assert chart[b"a"] == pytest.approx(np.log(0.25)) and chart["EOT"] == -np.inf
    half, quarter = np.log(0.5), np.log(0.25)
    assert (
        str(chart) == f"Chart {{\n  b'\\x00': {half},\n  b'a': {quarter},\n  'EOS': {quarter},\n}}"
    )
