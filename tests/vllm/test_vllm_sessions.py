"""Sessions: vLLM requests kept alive across steps (``VLLMLM(sessions=True)``).

The table's rules are checked on their own (no engine); the engine's rows through sessions
against transformers' full forward, in a process of their own (one in-process engine per
process, and the session's shared one is alive) with room for a few sessions: SMC steps,
forks after resampling, inputs of several tokens, a context asked twice, more particles
than sessions, chunked prefill, a LoRA adapter, a native sample, a cleared cache, a failed
batch and a close with sessions waiting.
"""

from __future__ import annotations

import json
import random
import textwrap

import numpy as np
import pytest

from genlm.backends.vllm._sessions import MAX_EXTENSION, MAX_IDLE_BATCHES, SessionTable

from .conftest import run_in_process

# ---- the table alone -------------------------------------------------------------------


def test_a_context_one_token_longer_feeds_its_session_the_new_token():
    table = SessionTable(4)
    (feed,), evicted = table.plan([(1, 2, 3)], None)
    assert feed.first and feed.tokens == (1, 2, 3) and not evicted
    table.commit([feed])
    (again,), _ = table.plan([(1, 2, 3, 4)], None)
    assert again.session is feed.session and not again.first and again.tokens == (4,)
    table.commit([again])
    assert feed.session.tokens == (1, 2, 3, 4) and len(table) == 1


def test_forks_feed_the_session_once_and_start_new_sessions_for_the_others():
    table = SessionTable(8)
    (parent,), _ = table.plan([(5, 6)], None)
    table.commit([parent])
    feeds, _ = table.plan([(5, 6, 1), (5, 6, 2), (5, 6, 3)], None)
    assert [f.session is parent.session for f in feeds] == [True, False, False]
    assert [f.tokens for f in feeds] == [(1,), (5, 6, 2), (5, 6, 3)]
    table.commit(feeds)
    assert sorted(s.tokens for s in table.sessions()) == [(5, 6, 1), (5, 6, 2), (5, 6, 3)]


def test_variants_keep_sessions_apart_and_long_extensions_start_anew():
    table = SessionTable(8)
    (base,), _ = table.plan([(1, 2)], None)
    table.commit([base])
    (other,), _ = table.plan([(1, 2, 3)], "adapter")
    assert other.first and other.session.variant == "adapter"
    far = (1, 2, *range(10, 10 + MAX_EXTENSION + 1))
    near = (1, 2, *range(10, 10 + MAX_EXTENSION))
    assert table.plan([far], None)[0][0].first
    assert table.plan([near], None)[0][0].session is base.session


def test_a_context_a_session_holds_runs_on_its_own():
    """A context equal to a live session's cannot feed it nothing: a one-off request,
    and the session stays."""
    table = SessionTable(4)
    (feed,), _ = table.plan([(1, 2, 3)], None)
    table.commit([feed])
    feeds, evicted = table.plan([(1, 2, 3), (1, 2, 3, 4)], None)
    assert feeds[0].session is None and feeds[0].tokens == (1, 2, 3)
    assert feeds[1].session is feed.session and not evicted


def test_past_the_caps_the_least_recently_used_idle_session_goes_then_one_offs():
    table = SessionTable(2, max_tokens=100)
    first, _ = table.plan([(1,), (2,)], None)
    table.commit(first)
    table.commit(table.plan([(2, 5)], None)[0])  # (1,) is now the least recently used
    feeds, evicted = table.plan([(2, 5, 6), (3,), (4,)], None)
    assert [s.tokens for s in evicted] == [(1,)]
    assert feeds[0].session is not None and not feeds[0].first
    assert feeds[1].first and feeds[2].session is None  # the fed session is never evicted
    table.commit(feeds)
    assert len(table) == 2 and table.held_tokens == 3 + 1
    feeds, evicted = table.plan([tuple(range(100, 201))], None)  # 101 tokens: never fits
    assert feeds[0].session is None and not evicted and len(table) == 2
    feeds, evicted = table.plan([tuple(range(100, 200))], None)  # 100 fit once both go
    assert feeds[0].first and len(evicted) == 2 and len(table) == 0


def test_idle_sessions_make_room_for_the_batchs_one_off_requests():
    """Each waiting session holds an engine slot: one-offs past the caps would otherwise
    wait for the slots the sessions leave. Sessions that missed their turn make way, the
    least recently used first; one fed in the batch before, in a step of several batches,
    keeps its slot."""
    table = SessionTable(3, max_tokens=10, slots=4)
    table.commit(table.plan([(1,), (2,), (3,)], None)[0])
    table.commit(table.plan([(1, 5), (2, 5), (3, 5)], None)[0])  # one batch a step
    feeds, evicted = table.plan([(1, 5, 6), tuple(range(20, 40)), tuple(range(40, 60))], None)
    assert feeds[0].session is not None and not feeds[0].first
    assert feeds[1].session is None and feeds[2].session is None  # 20 tokens: never fit
    assert [s.tokens for s in evicted] == [(2, 5)]  # 2 live sessions + 2 one-offs = 4 slots
    assert len(table) == 2
    table = SessionTable(2, slots=4)  # steps of two batches: (1,) then (2,)
    for context in [(1,), (2,), (1, 5), (2, 5)]:
        table.commit(table.plan([context], None)[0])
    assert table.period == 2
    feeds, evicted = table.plan([(1, 5, 6), (30,), (31,), (32,)], None)
    assert not evicted and sum(f.session is None for f in feeds) == 3  # (2, 5) waits its turn


def test_sessions_are_counted_in_whole_kv_blocks_and_an_ended_one_is_not_kept():
    table = SessionTable(4, max_tokens=256, block_size=128)
    (feed,), _ = table.plan([tuple(range(129))], None)  # two blocks: the whole budget
    table.commit([feed])
    assert table.held_tokens == 256
    table.commit(table.plan([tuple(range(130))], None)[0])  # fed: the period is one batch
    assert table.held_tokens == 256 and table.period == 1
    feeds, evicted = table.plan([(1000,)], None)
    assert feeds[0].first and evicted == [feed.session]
    feeds[0].session.ended = True  # aborted before its batch ended
    table.commit(feeds)
    assert len(table) == 0 and table.held_tokens == 0


def cycle(table: SessionTable, particles: list[tuple[int, ...]], batch: int) -> dict[str, int]:
    """One SMC step of ``particles`` through ``table``, cut into batches of ``batch`` as core
    cuts a step; each particle then grows by a token. How its contexts reached the engine."""
    kinds = {"fed": 0, "new": 0, "one-off": 0, "evicted": 0}
    for start in range(0, len(particles), batch):
        feeds, evicted = table.plan(particles[start : start + batch], None)
        kinds["evicted"] += len(evicted)
        for feed in feeds:
            kinds["one-off" if feed.session is None else "new" if feed.first else "fed"] += 1
        table.commit(feeds)
    for i, particle in enumerate(particles):
        particles[i] = particle + (i,)
    return kinds


@pytest.mark.parametrize(
    "n_particles, batch, cap, slots",
    [
        (12, 4, 8, 16),
        (12, 6, 8, 16),
        (300, 128, 128, 256),
        (300, 128, 64, 128),
        (200, 100, 64, 128),
    ],
)
def test_more_particles_than_sessions_in_several_batches_feed_the_capped_sessions(
    n_particles, batch, cap, slots
):
    """Least recently used would evict, batch after batch, the sessions the batch before
    fed (a cycle longer than the cache), so that no session was ever fed again: the
    sessions the cap holds are fed every step, the rest run as one-offs. With fewer slots
    than a batch's one-offs and the sessions, the one-offs wait for a slot rather than
    evict them."""
    table = SessionTable(cap, slots=slots)
    particles = [(1000 + i, 7) for i in range(n_particles)]
    assert cycle(table, particles, batch) == {
        "fed": 0,
        "new": cap,
        "one-off": n_particles - cap,
        "evicted": 0,
    }
    for _ in range(4):
        assert cycle(table, particles, batch) == {
            "fed": cap,
            "new": 0,
            "one-off": n_particles - cap,
            "evicted": 0,
        }
    assert table.period == -(-n_particles // batch)  # the step's batches


def test_a_session_that_missed_its_turn_makes_way_for_a_new_one():
    """Two batches a step: a particle replaced by a new context (resampling) leaves its
    session idle; once that session has missed its turn and the batch of grace after it,
    a context waiting for a session (run as a one-off so far) takes its place."""
    table = SessionTable(4, slots=8)
    particles = [(10 + i, 7) for i in range(6)]
    cycle(table, particles, 3)
    cycle(table, particles, 3)  # four fed, two one-offs; the period is two batches
    dead = table.sessions()[0]
    assert dead.tokens == particles[0][:-1] and table.period == 2
    particles[0] = (99, 98)  # particle 0 (fed) is replaced by a context of its own
    feeds, evicted = table.plan(particles[:3], None)  # its turn: missed
    assert feeds[0].session is None and not evicted
    table.commit(feeds)
    feeds, evicted = table.plan(particles[3:], None)  # the batch of grace, then gone
    assert evicted == [dead] and feeds[1].first and feeds[2].session is None
    table.commit(feeds)
    particles[:] = [particle + (i,) for i, particle in enumerate(particles)]
    assert cycle(table, particles, 3) == {"fed": 4, "new": 0, "one-off": 2, "evicted": 0}


def test_before_any_session_is_fed_an_idle_one_goes_only_after_many_batches():
    """The period is not known yet: a session never fed is kept (the context that found no
    room runs as a one-off) until it has been idle for MAX_IDLE_BATCHES batches."""
    table = SessionTable(1)
    table.commit(table.plan([(1, 2)], None)[0])
    for i in range(MAX_IDLE_BATCHES - 1):
        feeds, evicted = table.plan([(500 + i,)], None)
        assert feeds[0].session is None and not evicted
        table.commit(feeds)
    feeds, evicted = table.plan([(3, 4)], None)
    assert feeds[0].first and [s.tokens for s in evicted] == [(1, 2)]


def test_a_long_idle_session_fed_again_does_not_stall_the_table():
    """A session fed again 201 batches on makes the period 201: new work got no session for
    as long (the table's sessions never missed their turn). The period counts for
    MAX_IDLE_BATCHES at most."""
    table = SessionTable(2)
    table.commit(table.plan([(1, 2)], None)[0])
    context = (500,)
    for _ in range(200):  # another session, fed every batch
        table.commit(table.plan([context], None)[0])
        context += (7,)
    table.commit(table.plan([(1, 2, 3)], None)[0])  # the first, fed again
    assert table.period == 201
    particles = [(900, 1), (901, 1)]
    fed = [cycle(table, particles, 2)["fed"] for _ in range(MAX_IDLE_BATCHES + 2)]
    assert fed[-1] == 2


def test_random_batches_keep_the_tables_invariants():
    """Random SMC-like batches (extensions, forks, repeats, variants, caps): every session
    fed is extended to exactly its context, none is fed twice in a batch or evicted while
    fed, a context extending an unclaimed session within reach is never sent elsewhere, and
    the table's counts stay true and within its caps."""
    rng = random.Random(0)
    table = SessionTable(6, max_tokens=200, slots=8)
    pool = [(1, 2)]
    for _ in range(300):
        variant = rng.choice([None, "a"])
        batch = {
            rng.choice(pool) + tuple(rng.randrange(50) for _ in range(rng.choice([0, 1, 1, 3, 9])))
            for _ in range(rng.randrange(1, 6))
        }
        batch = [c for c in batch if c]
        before = {id(s): s.tokens for s in table.sessions()}
        keys = {(s.variant, s.tokens) for s in table.sessions()}
        feeds, evicted = table.plan(batch, variant)
        fed = [f.session for f in feeds if f.session is not None]
        assert len({id(s) for s in fed}) == len(fed)
        assert not {id(s) for s in evicted} & {id(s) for s in fed}
        for context, feed in zip(batch, feeds):
            if feed.session is None or feed.first:
                assert feed.tokens == context
                if feed.session is None and (variant, context) not in keys:
                    continue
            else:
                assert before[id(feed.session)] + feed.tokens == context
                assert 1 <= len(feed.tokens) <= MAX_EXTENSION
        claimed = {id(s) for s in fed}
        one_offs = sum(f.session is None for f in feeds)
        # Past the slots only while every idle session is still within its turn.
        period = table.period
        turn = MAX_IDLE_BATCHES if period is None else min(period + (period > 1), MAX_IDLE_BATCHES)
        missed = [
            s
            for s in table.sessions()
            if id(s) not in claimed and s.fed_at <= table._batches - turn
        ]
        assert len(table) + sum(f.first for f in feeds) + one_offs <= 8 or not missed
        for context, feed in zip(batch, feeds):
            if feed.session is None or feed.first:
                reachable = [
                    s
                    for s in table.sessions()
                    if id(s) not in claimed
                    and s.variant == variant
                    and 0 < len(context) - len(s.tokens) <= MAX_EXTENSION
                    and context[: len(s.tokens)] == s.tokens
                ]
                assert not reachable or (variant, context) in keys
        table.commit(feeds)
        assert len(table) <= 6
        assert table.held_tokens == sum(len(s.tokens) for s in table.sessions())
        assert len({(s.variant, s.tokens) for s in table.sessions()}) == len(table)
        pool = [s.tokens for s in table.sessions()] or [(1, 2)]


# ---- the engine ------------------------------------------------------------------------

SCENARIO = textwrap.dedent(
    """
    import asyncio, json, sys
    import numpy as np
    from genlm.backends.vllm import VLLMLM

    path, opts, adapter, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
    lm = VLLMLM.from_name(path, engine_opts=opts, sessions=True, cache_bytes=0)
    lm.add_lora(adapter, "adapter")
    table = lm._sessions
    kinds = {"fed": 0, "new": 0, "one-off": 0}
    plan = table.plan

    def counting_plan(contexts, variant):
        feeds, evicted = plan(contexts, variant)
        for f in feeds:
            kinds["one-off" if f.session is None else "new" if f.first else "fed"] += 1
        return feeds, evicted

    table.plan = counting_plan
    relieved = []  # sessions ended because the engine looked stalled
    relieve, end = lm._relieve_stall, lm._end_sessions

    def counting_relieve(*args):
        lm._end_sessions = lambda sessions: (relieved.extend(sessions), end(sessions))
        try:
            return relieve(*args)
        finally:
            lm._end_sessions = end

    lm._relieve_stall = counting_relieve
    asked, report = [], {"caps": [table.max_sessions, table.max_tokens]}
    rng = np.random.default_rng(0)

    def step(contexts, variant=None):
        rows = asyncio.run(lm.batch_next_token_logprobs(contexts, variant=variant))
        asked.extend((list(c), variant, row) for c, row in zip(contexts, rows))

    # The token a session samples and drops completes its last KV block: a context of 31
    # tokens, 32-token blocks. Fed another token, the session must not leave that block in
    # the prefix cache under the dropped token's hash, where a context holding the dropped
    # token would find it.
    head = [int(t) for t in rng.integers(0, 1000, 31)]
    step([head])
    dropped = int(np.argmax(asked[-1][2]))  # what the session sampled (greedy)
    other = (dropped + 1) % 1000
    step([head + [other]])
    step([head + [dropped, 5]])
    report["poison"] = [dropped, other]

    particles = [[int(t) for t in rng.integers(0, 1000, 40 + 25 * i)] for i in range(5)]
    for n in range(6):
        step(particles)
        if n == 2:  # resampling: particle 0's context three times over
            particles = [list(particles[0]) for _ in range(3)] + particles[3:]
        grow = 3 if n == 3 else 1  # once, every particle grows by several tokens
        particles = [p + [int(t) for t in rng.integers(0, 1000, grow)] for p in particles]
    report["live_after_steps"] = len(table)
    step(particles[:2])
    step(particles[:2])  # contexts their sessions now hold: one-off requests
    step([p + [7] for p in particles[:2]], variant="adapter")
    step([p + [7, 8] for p in particles[:2]], variant="adapter")
    report["kinds"] = dict(kinds)

    # A generation many more engine steps long than a row batch's step limit.
    drawn = asyncio.run(lm.batch_sample([particles[0][:20]], 400, eos_token_ids=[]))
    report["sampled"] = len(drawn[0])
    report["live_after_sample"] = len(table)
    step([p + [9] for p in particles])
    lm.clear_cache()
    report["live_after_clear"] = len(table)
    step([p + [9, 10] for p in particles])

    engine = lm.llm.llm_engine
    real_step = engine.step
    def failing_step():
        engine.step = real_step
        raise RuntimeError("injected step failure")
    engine.step = failing_step
    try:
        step([p + [9, 10, 11] for p in particles])
        report["failure"] = None
    except RuntimeError as exc:
        report["failure"] = str(exc)
    report["live_after_failure"] = len(table)
    step([p + [9, 10, 11, 12] for p in particles])
    report["live_at_close"] = len(table)

    # Eight particles of short contexts, more than the engine's four slots: requests
    # answered within their own step leave nothing running, which is not a stall.
    report["relieved_before"] = len(relieved)
    many = [[int(t) for t in rng.integers(0, 1000, 5)] for _ in range(8)]
    report["live_in_many"] = []
    for n in range(4):
        step(many)
        report["live_in_many"].append(len(table))
        many = [p + [int(rng.integers(0, 1000))] for p in many]
    report["relieved"] = len(relieved)
    lm.close()
    report["closed_with"] = len(table)
    report["asked"] = [[c, v] for c, v, _ in asked]
    np.save(out, np.stack([row for _, _, row in asked]))
    print(json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def scenario(tiny_path, adapter, tmp_path_factory):
    """The report and rows of :data:`SCENARIO`, run in a process of its own: an engine with
    four request slots (three sessions), chunked prefill, LoRA."""
    from .conftest import ENGINE_OPTS

    opts = {**ENGINE_OPTS, "max_num_seqs": 4, "block_size": 32}
    out = tmp_path_factory.mktemp("sessions") / "rows.npy"
    args = [str(tiny_path), json.dumps(opts), str(adapter[0]), str(out)]
    return run_in_process(SCENARIO, args, timeout=KILL_AFTER_S), np.load(out)


#: Seconds a test's own process may run: under pytest-timeout's 300 s, so the process is
#: killed, not left.
KILL_AFTER_S = 240


def test_rows_through_sessions_are_transformers_rows(scenario, expected, merged_model):
    """Every row of the scenario (fed sessions, new ones, one-offs, the adapter's, after a
    sample, a clear and a failure) is transformers' full-forward row for its context."""
    report, rows = scenario
    assert len(report["asked"]) == len(rows) > 40
    for (context, variant), row in zip(report["asked"], rows):
        model = merged_model if variant == "adapter" else None
        want = expected(context) if model is None else expected(context, model=model)
        np.testing.assert_allclose(row, want, atol=1e-4)


def test_a_dropped_token_leaves_no_block_in_the_prefix_cache(scenario, expected):
    """vLLM 0.26 and 0.27 keep the hash of a block completed by the token a session sampled
    (and drops at its next input); the block, filled with the next input, then entered the
    prefix cache under it, and a context holding the sampled token read the other's KV."""
    report, rows = scenario
    dropped, other = report["poison"]
    assert dropped != other
    (first, _), (fed, _), (holding, _) = report["asked"][:3]
    assert fed == first + [other] and holding == first + [dropped, 5] and len(first) == 31
    np.testing.assert_allclose(rows[2], expected(holding), atol=1e-4)


def test_sessions_are_fed_capped_and_ended_when_they_must_be(scenario):
    report, _ = scenario
    assert report["caps"][0] == 2  # half the engine's four slots
    # First, the prefix-cache check: a session started, fed, and a second one started.
    # Six steps of five particles: two sessions (the cap), three one-offs a step; the fork
    # feeds particle 0's session once and starts one (the other idle one evicted). Then
    # two fed, the same two contexts again (one-offs), two adapter sessions started
    # (evicting the two base ones) and fed.
    assert report["kinds"] == {"fed": 1 + 9 + 2 + 2, "new": 2 + 3 + 2, "one-off": 18 + 2}
    assert report["live_after_steps"] == 2
    assert report["sampled"] == 400  # no step limit cut it short
    assert report["live_after_sample"] == 0  # a generation needs the slots
    assert report["live_after_clear"] == 0  # the prefix cache resets only with none left
    assert report["failure"] == "injected step failure"
    assert report["live_after_failure"] == 0  # every session the failed batch fed ended
    assert report["live_at_close"] == 2 and report["closed_with"] == 0
    assert report["relieved_before"] == report["relieved"] == 0  # never stalled here
    assert report["live_in_many"] == [2, 2, 2, 2]


PRESSURE = textwrap.dedent(
    """
    import asyncio, json, sys
    import numpy as np
    from genlm.backends.vllm import VLLMLM

    path, opts, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    report, asked = {}, []
    rng = np.random.default_rng(0)

    def ask(lm, contexts):
        steps = [0]
        engine = lm.llm.llm_engine
        real = engine.step

        def counting():
            steps[0] += 1
            return real()

        engine.step = counting
        rows = asyncio.run(lm.batch_next_token_logprobs(contexts))
        engine.step = real
        asked.extend(zip(contexts, rows))
        return steps[0]

    # Eight KV blocks of 128 tokens. Waiting sessions keep theirs; a one-off context longer
    # than the blocks they leave free can run only once they end.
    small = {**opts, "max_model_len": 880, "kv_cache_memory_bytes": 2048 * 1024}
    lm = VLLMLM.from_name(path, engine_opts=small, sessions=True, cache_bytes=0)
    cache = lm.llm.llm_engine.vllm_config.cache_config
    report["blocks"] = [cache.num_gpu_blocks, cache.block_size]
    ask(lm, [[int(t) for t in rng.integers(0, 1000, 160)] for _ in range(3)])
    report["live_before"] = len(lm._sessions)
    ask(lm, [[int(t) for t in rng.integers(0, 1000, 700)]])
    report["live_after"] = len(lm._sessions)
    lm.close()

    # A long-prefill threshold of 4 tokens a step: three 800-token contexts take some 200
    # engine steps, each request far below the step's token budget.
    slow = {**opts, "max_model_len": 880, "max_num_batched_tokens": 1024,
            "long_prefill_token_threshold": 4}
    lm = VLLMLM.from_name(path, engine_opts=slow, sessions=True, cache_bytes=0)
    report["slow_steps"] = ask(lm, [[int(t) for t in rng.integers(0, 1000, 800)] for _ in range(3)])
    lm.close()
    report["asked"] = [c for c, _ in asked]
    np.save(out, np.stack([row for _, row in asked]))
    print(json.dumps(report))
    """
)


def test_sessions_give_way_to_a_request_that_needs_their_blocks(tiny_path, expected, tmp_path):
    """Waiting sessions hold KV blocks: a one-off context needing more than they leave free
    is still answered (the waiting sessions end), and a batch whose prefill takes hundreds
    of engine steps (a long-prefill threshold) is not cut off by the step limit. Each row is
    transformers'."""
    from .conftest import ENGINE_OPTS_NO_LORA

    opts = {**ENGINE_OPTS_NO_LORA, "max_num_seqs": 4}
    out = tmp_path / "rows.npy"
    args = [str(tiny_path), json.dumps(opts), str(out)]
    report = run_in_process(PRESSURE, args, timeout=KILL_AFTER_S)
    rows = np.load(out)
    blocks, size = report["blocks"]  # 8 of 128 tokens on CPU
    held = -(-160 // size) * size  # what one 160-token session holds, in whole blocks
    assert report["live_before"] == min(2, blocks * size // 2 // held) > 0  # 2: half the slots
    assert 700 > blocks * size - report["live_before"] * held  # the one-off needs theirs
    assert report["live_after"] == 0
    assert report["slow_steps"] > 150
    assert len(report["asked"]) == len(rows) == 7
    for context, row in zip(report["asked"], rows):
        np.testing.assert_allclose(row, expected(context), atol=1e-4)


def test_the_option_must_be_a_bool(tiny_path):
    """Any truthy value turned sessions on (``sessions="no"`` did); it is refused before
    anything loads."""
    from genlm.backends.vllm import VLLMLM

    from .conftest import ENGINE_OPTS

    for value in ("no", 1, None):
        with pytest.raises(TypeError, match="sessions must be True or False"):
            VLLMLM.from_name(str(tiny_path), engine_opts=ENGINE_OPTS, sessions=value)


def test_the_option_needs_the_in_process_route(tiny_path):
    from genlm.backends.vllm import VLLMLM

    from .conftest import ENGINE_OPTS

    with pytest.raises(ValueError, match="sessions=True needs the in-process row route"):
        VLLMLM.from_name(
            str(tiny_path), engine_opts=ENGINE_OPTS, row_source="logprobs", sessions=True
        )
