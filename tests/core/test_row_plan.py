"""Core's row planner against brute-force expectations over random context sets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from genlm.core.backend import ResidentRows, group_equal, group_padded, plan_rows

#: Small alphabets and lengths, so random contexts often share prefixes.
tokens = st.lists(st.integers(0, 2), min_size=1, max_size=6).map(tuple)
resident_lists = st.lists(st.one_of(st.none(), tokens), max_size=6)


def brute_row(contexts, query, max_length):
    """The row holding the longest ``query[:n]`` (n <= max_length); ties go to the last row."""
    best = None
    for i, held in enumerate(contexts):
        if held is not None and len(held) <= max_length and query[: len(held)] == held:
            if best is None or len(held) >= len(contexts[best]):
                best = i
    return best


@settings(max_examples=300, deadline=None)
@given(resident_lists, tokens, st.integers(0, 7))
def test_row_is_the_longest_resident_prefix(contexts, query, max_length):
    assert ResidentRows(contexts).row(query, max_length) == brute_row(contexts, query, max_length)


@settings(max_examples=300, deadline=None)
@given(resident_lists, tokens, st.integers(0, 7), st.integers(0, 7))
def test_holds_means_same_row_exact_past(contexts, context, i, past):
    expected = i < len(contexts) and contexts[i] is not None and contexts[i] == context[:past]
    expected = expected and past <= len(context)
    assert ResidentRows(contexts).holds(i, context, past) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(tokens, min_size=1, max_size=6), st.data())
def test_extend_all_matches_brute_force(resident, data):
    # Half the batches are real SMC steps (each picks a row and adds the same tokens).
    if data.draw(st.booleans()):
        step = data.draw(st.integers(1, 3))
        extra = st.lists(st.integers(0, 2), min_size=step, max_size=step).map(tuple)
        picks = data.draw(st.lists(st.integers(0, len(resident) - 1), min_size=1, max_size=6))
        contexts = [resident[p] + data.draw(extra) for p in picks]
    else:
        contexts = data.draw(st.lists(tokens, min_size=1, max_size=6))
    sources = [brute_row(resident, c, len(c) - 1) for c in contexts]
    counts = {len(c) - len(resident[s]) for c, s in zip(contexts, sources) if s is not None}
    plan = ResidentRows(resident).extend_all(contexts)
    if None in sources or len(counts) != 1:
        assert plan is None
    else:
        assert plan == (sources, counts.pop())
        for context, source in zip(contexts, plan[0]):  # the plan is sound: row + new tokens
            assert context[: len(resident[source])] == resident[source]


@settings(max_examples=300, deadline=None)
@given(st.lists(tokens, max_size=8), st.lists(tokens, min_size=1, max_size=8))
def test_plan_rows_resumes_from_the_longest_proper_cached_prefix(cached, contexts):
    store = {c: f"kv{c}" for c in cached}

    def lookup(context, limit):  # a linear scan, the brute force the prefix trie replaces
        hits = [c for c in store if len(c) <= limit and context[: len(c)] == c]
        best = max(hits, key=len, default=None)
        return (0, None) if best is None else (len(best), store[best])

    rows = plan_rows(contexts, lookup)
    assert [r.index for r in rows] == list(range(len(contexts)))
    for context, row in zip(contexts, rows):
        assert row.context == context
        assert 1 <= row.new == len(context) - row.past  # the last token always runs
        longest = max(
            (len(c) for c in cached if len(c) < len(context) and context[: len(c)] == c),
            default=0,
        )
        assert row.past == longest
        assert row.cached == (store[context[:longest]] if longest else None)


@given(st.lists(st.integers(1, 6), max_size=12))
def test_group_equal_partitions_by_count_in_first_seen_order(news):
    groups = group_equal(news)
    assert sorted(i for g in groups for i in g) == list(range(len(news)))
    assert [news[g[0]] for g in groups] == list(dict.fromkeys(news))
    for group in groups:
        assert group == sorted(group) and {news[i] for i in group} == {news[group[0]]}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 40), max_size=12), st.integers(1, 80))
def test_group_padded_is_the_greedy_split_of_the_sorted_rows(news, max_tokens):
    """Each group is admissible, and the next group's first row could not have joined it."""

    def admissible(group):
        counts = [news[i] for i in group]
        small_spread = max(counts) <= 2 * min(counts) + 8
        return len(group) == 1 or (small_spread and max(counts) * len(group) <= max_tokens)

    groups = group_padded(news, max_tokens)
    flat = [i for g in groups for i in g]
    assert flat == sorted(range(len(news)), key=lambda i: (news[i], i))
    assert all(groups) and all(admissible(g) for g in groups)
    for group, following in zip(groups, groups[1:]):
        assert not admissible([*group, following[0]])
