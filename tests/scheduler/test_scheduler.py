"""Scheduler-level tests: vLLM's real scheduler and block pool, synthetic model.

Each test runs on both scheduler variants (sync and async, see the `build`
fixture in conftest.py), and the block accounting is audited after every step.
"""

from __future__ import annotations

import pytest
from vllm.v1.request import RequestStatus

from vllm_continuum.core.pressure import blocks_freed


from tests.scheduler.harness import (
    BLOCK_SIZE,
    EOS_TOKEN_ID,
    FILLER_TOKEN,
    Driver,
    admitted_hit,
    answer_script,
    assert_all_free,
    audit,
    drain,
    first_turn,
    make_request,
    next_turn,
    tokens,
    tool_call_script,
)


# --------------------------------------------------------------------- pinning
def test_tool_call_turn_is_pinned_and_named(build):
    d = build()
    s = d.scheduler
    turn = make_request(tokens(0, 100), session="A", max_tokens=32)
    d.add(turn, tool_call_script(d, name="web_search"))
    d.run_until_finished(turn)
    pin = s.continuum.pins.get("A")
    assert pin is not None and pin.request_id == turn.request_id
    assert pin.tool == "web_search"
    assert pin.num_blocks == -(-(turn.num_tokens - 1) // BLOCK_SIZE)
    assert s.continuum.stats.pins_by_tool == {"web_search": 1}
    assert audit(s)["pinned"] == pin.num_blocks
    assert_all_free(d)


def test_hinted_tool_pins_without_tool_token(build):
    d = build()
    turn = make_request(tokens(0, 64), session="A", xargs={"continuum_tool": "calc"})
    d.add(turn, answer_script())
    d.run_until_finished(turn)
    assert d.scheduler.continuum.pins.get("A").tool == "calc"


@pytest.mark.parametrize(
    "session, xargs, script",
    [
        (None, None, "tool"),  # no session: nothing to resume
        ("A", {"continuum_last_turn": 1}, "tool"),  # the session said it is done
        ("A", None, "answer"),  # no tool call
        ("A", {"continuum_ttl_s": 0}, "tool"),  # TTL 0 means no pin
    ],
)
def test_no_pin(build, session, xargs, script):
    d = build()
    turn = make_request(tokens(0, 64), session=session, xargs=xargs)
    d.add(turn, tool_call_script(d) if script == "tool" else answer_script())
    d.run_until_finished(turn)
    assert len(d.scheduler.continuum.pins) == 0
    assert_all_free(d)


def test_ttl_sources_and_cap(build):
    d = build(settings={"default_ttl_s": 3, "tool_ttl_s": {"slow": 9}, "max_ttl_s": 8})
    s = d.scheduler
    for i, (name, xargs) in enumerate(
        [("fast", None), ("slow", None), ("fast", {"continuum_ttl_s": 5}), ("fast", {"continuum_ttl_s": 99})]
    ):
        first_turn(d, f"S{i}", start=1000 * i, name=name, xargs=xargs)
    assert [(t, ttl, src) for t, ttl, src in s.continuum.stats.ttl_decisions] == [
        ("fast", 3.0, "default"),
        ("slow", 8.0, "tool+cap"),
        ("fast", 5.0, "hint"),
        ("fast", 8.0, "hint+cap"),
    ]
    assert s.continuum.pins.get("S2").ttl_s == pytest.approx(5.0)


def test_parallel_branches_of_a_session_keep_separate_pins(build):
    d = build()
    s = d.scheduler
    a = make_request(tokens(0, 64), session="A", max_tokens=32)
    b = make_request(tokens(500, 64), session="A", max_tokens=32)
    d.add(a, tool_call_script(d))
    d.add(b, [FILLER_TOKEN] * 3 + tool_call_script(d))
    d.run_until_finished(a, b)
    assert {p.request_id for p in s.continuum.pins.of_session("A")} == {a.request_id, b.request_id}
    assert s.continuum.stats.releases_by_reason == {}
    # Each branch's next turn takes over its own pin, and only it.
    t2 = next_turn(a)
    d.add(t2, answer_script())
    admitted_hit(d, t2)
    assert [p.request_id for p in s.continuum.pins.of_session("A")] == [b.request_id]
    drain(d)
    assert_all_free(d)


def test_a_newer_pin_holding_all_of_an_older_ones_blocks_replaces_it(build):
    """n > 1 samples of one prompt: when both end in a tool call before a block
    of output fills, the second pin holds every block of the first."""
    d = build()
    s = d.scheduler
    prompt = tokens(0, 64)
    a = make_request(prompt, session="A", max_tokens=32)
    b = make_request(prompt, session="A", max_tokens=32)
    d.add(a, tool_call_script(d))
    d.add(b, [FILLER_TOKEN] * 3 + tool_call_script(d))
    d.run_until_finished(a, b)
    assert len(s.continuum.pins) == 1 and s.continuum.pins.get("A").request_id == b.request_id
    assert s.continuum.stats.releases_by_reason == {"replaced": 1}
    assert_all_free(d)


# ------------------------------------------------------------------- hand-off
def test_next_turn_hits_every_full_block_and_takes_over_the_pin(build):
    d = build()
    s = d.scheduler
    t1 = first_turn(d, "A", prompt_len=150)
    t2 = next_turn(t1)
    d.add(t2, answer_script())
    hit = admitted_hit(d, t2)
    assert hit >= (t1.num_prompt_tokens // BLOCK_SIZE) * BLOCK_SIZE
    assert s.continuum.pins.get("A") is None
    assert s.continuum.stats.releases_by_reason == {"resumed": 1}
    assert s.continuum.stats.resumes_by_outcome == {"pinned": 1}
    assert s.continuum.stats.resume_cached_tokens == hit
    drain(d)
    assert_all_free(d)


def _churn(d: Driver, rounds: int, prompt_len: int) -> None:
    """Other sessions' traffic, one after another, each fitting beside the pin."""
    for i in range(rounds):
        other = make_request(tokens(7000 + 600 * i, prompt_len), max_tokens=2)
        d.add(other)
        d.run_until_finished(other)


def test_pin_survives_churn_that_evicts_it_in_stock_vllm(tiny_model_dir, build):
    hits = {}
    for flavour in ("continuum", "stock"):
        d = build(num_blocks=40, continuum=flavour == "continuum")
        t1 = first_turn(d, "A", prompt_len=200)
        _churn(d, rounds=4, prompt_len=300)
        t2 = next_turn(t1)
        d.add(t2, answer_script())
        hits[flavour] = admitted_hit(d, t2)
    full_blocks = (t1.num_prompt_tokens // BLOCK_SIZE) * BLOCK_SIZE
    assert hits["continuum"] >= full_blocks
    assert hits["stock"] < full_blocks


def test_pinned_session_turn_is_admitted_before_earlier_unpinned_work(build):
    d = build(max_num_seqs=1)
    s = d.scheduler
    t1 = first_turn(d, "A")
    busy = make_request(tokens(3000, 32), max_tokens=6)
    d.add(busy)
    d.step()  # `busy` takes the only slot
    early = make_request(tokens(4000, 32), max_tokens=2)
    d.add(early)
    t2 = next_turn(t1)
    d.add(t2, answer_script())
    assert list(s.waiting)[0] is t2
    order = []
    for _ in range(40):
        out = d.step()
        order += [n.req_id for n in out.scheduled_new_reqs]
        if early.is_finished() and t2.is_finished():
            break
    assert order == [t2.request_id, early.request_id]


# ---------------------------------------------------------------------- expiry
def test_pin_expires_lazily_at_next_schedule(build):
    d = build()
    s = d.scheduler
    first_turn(d, "A")
    s.continuum.clock.advance(s.continuum.config.default_ttl_s - 0.01)
    s.schedule()
    assert s.continuum.pins.get("A") is not None
    s.continuum.clock.advance(0.02)
    assert s.continuum.pins.get("A") is not None  # nothing ticks while idle
    s.schedule()
    assert s.continuum.pins.get("A") is None
    assert s.continuum.stats.releases_by_reason == {"expired": 1}
    assert_all_free(d)


def test_expiry_also_runs_at_add_request(build):
    d = build()
    s = d.scheduler
    first_turn(d, "A")
    s.continuum.clock.advance(60)
    d.add(make_request(tokens(9000, 20)))
    assert s.continuum.stats.releases_by_reason == {"expired": 1}


def test_ttl_is_a_hard_bound_with_one_step_of_grace_for_a_queued_turn(build):
    """An expired pin whose next turn is queued is kept through one more
    scheduling step (the turn may be admitted in it), never longer."""
    d = build(max_num_seqs=1)
    s = d.scheduler
    t1 = first_turn(d, "A")
    busy = make_request(tokens(3000, 32), max_tokens=8)
    d.add(busy)
    d.step()
    t2 = next_turn(t1)
    d.add(t2, answer_script())
    s.continuum.clock.advance(60)
    d.step()  # busy holds the only slot: t2 waits through its grace step
    assert s.continuum.pins.get("A") is not None, "no grace step for a queued next turn"
    d.step()
    assert s.continuum.pins.get("A") is None, "kept past its TTL beyond the grace step"
    assert s.continuum.stats.releases_by_reason == {"expired": 1}


def test_grace_step_hands_the_pin_over_when_the_turn_is_admitted(build):
    d = build()
    s = d.scheduler
    t1 = first_turn(d, "A")
    t2 = next_turn(t1)
    d.add(t2, answer_script())
    s.continuum.clock.advance(60)
    hit = admitted_hit(d, t2)
    assert hit >= (t1.num_prompt_tokens // BLOCK_SIZE) * BLOCK_SIZE
    assert s.continuum.stats.releases_by_reason == {"resumed": 1}


# -------------------------------------------------------------------- pressure
def test_pins_are_released_before_any_preemption(build):
    d = build(num_blocks=24)
    s = d.scheduler
    preemptions = []
    stock_preempt = s._preempt_request

    def watch(request, *args, **kwargs):
        freeable = blocks_freed(list(s.continuum.pins), s._ledger.ref_count)
        preemptions.append((request.request_id, freeable))
        return stock_preempt(request, *args, **kwargs)

    s._preempt_request = watch
    first_turn(d, "A", prompt_len=100)  # 7 blocks pinned
    grower = make_request(tokens(2000, 150), max_tokens=120)  # grows to 17 blocks
    d.add(grower)
    d.run_until_finished(grower)
    assert grower.num_preemptions == 0
    assert all(n == 0 for _, n in preemptions)
    assert s.continuum.stats.releases_by_reason == {"pressure": 1}
    assert_all_free(d)


def test_yield_admits_a_waiting_request_as_if_pins_were_not_there(build):
    steps = {}
    for flavour in ("continuum", "stock"):
        d = build(num_blocks=41, continuum=flavour == "continuum")
        first_turn(d, "A", prompt_len=300)  # 19-20 blocks
        big = make_request(tokens(4000, 380), max_tokens=4)  # 24 blocks
        d.add(big)
        hit = admitted_hit(d, big)
        steps[flavour] = (hit, big.status)
    assert steps["continuum"] == steps["stock"]


def test_own_prefix_hit_is_not_released_for_room(build):
    d = build(num_blocks=41)
    s = d.scheduler
    t1 = first_turn(d, "A", prompt_len=300)  # 19-20 blocks pinned, 20 free
    t2 = next_turn(t1, extra=100)  # 26 blocks, 18 of them already pinned
    d.add(t2, answer_script())
    admitted_hit(d, t2)
    assert s.continuum.stats.releases_by_reason == {"resumed": 1}


def test_pins_are_not_released_for_nothing(build):
    d = build(num_blocks=41)
    s = d.scheduler
    first_turn(d, "A", prompt_len=60)  # 4 blocks pinned
    hog = make_request(tokens(2000, 480), max_tokens=200)  # 31+ blocks, runs long
    d.add(hog)
    d.step()
    waiter = make_request(tokens(6000, 200), max_tokens=2)  # 13 blocks: cannot fit
    d.add(waiter)
    d.step()
    assert waiter.status == RequestStatus.WAITING
    assert s.continuum.pins.get("A") is not None
    assert s.continuum.stats.releases_by_reason == {}


def test_pinned_blocks_never_exceed_the_cap(build):
    d = build(num_blocks=64, settings={"max_pinned_fraction": 0.25})  # 15 of 63 blocks
    s = d.scheduler
    # Sessions arrive A, B, C; their turns end B, C, A.
    a = make_request(tokens(0, 100), session="A", max_tokens=32)
    b = make_request(tokens(1000, 100), session="B", max_tokens=32)
    c = make_request(tokens(2000, 100), session="C", max_tokens=32)
    d.add(a, [FILLER_TOKEN] * 4 + tool_call_script(d))
    d.advance(1.0)
    d.add(b, tool_call_script(d))
    d.advance(1.0)
    d.add(c, [FILLER_TOKEN] * 2 + tool_call_script(d))
    for _ in range(30):
        d.step()
        assert s.continuum.pins.num_pinned_blocks <= 15
    assert {p.session_id for p in s.continuum.pins} == {"A", "B"}  # C arrived last: its pin went
    assert s.continuum.stats.releases_by_reason == {"pressure": 1}


# ------------------------------------------------------- abort, reset, end
def test_abort_of_a_queued_turn_releases_the_session_pin(build):
    d = build()
    s = d.scheduler
    t1 = first_turn(d, "A")
    t2 = next_turn(t1)
    d.add(t2)
    s.finish_requests(t2.request_id, RequestStatus.FINISHED_ABORTED)
    assert s.continuum.pins.get("A") is None
    assert s.continuum.stats.releases_by_reason == {"aborted": 1}
    assert_all_free(d)


def test_stop_string_abort_after_a_tool_call_still_pins(build):
    d = build()
    s = d.scheduler
    turn = make_request(tokens(0, 64), session="A", max_tokens=32)
    d.add(turn, tool_call_script(d)[:-1] + [FILLER_TOKEN] * 30)
    for _ in range(4):
        d.step()
    s.finish_requests(turn.request_id, RequestStatus.FINISHED_ABORTED)
    assert s.continuum.pins.get("A") is not None


def test_last_turn_releases_the_pins_it_continues_only(build):
    """A last turn ends the pins whose context it continues. One of the same
    session id that does not continue a pin (a parallel branch admitted before
    the pin existed, or a guessed id) leaves it to its TTL."""
    d = build()
    s = d.scheduler
    late = make_request(
        tokens(800, 64), session="A", max_tokens=32, xargs={"continuum_last_turn": True}
    )
    d.add(late, [FILLER_TOKEN] * 8 + [EOS_TOKEN_ID])
    d.step()  # admitted before any pin exists
    t1 = make_request(tokens(0, 64), session="A", max_tokens=32)
    d.add(t1, tool_call_script(d))
    d.run_until_finished(t1, late)
    assert s.continuum.pins.get("A") is not None
    assert s.continuum.stats.releases_by_reason == {}
    last = d.add(next_turn(t1, xargs={"continuum_last_turn": True}), answer_script())
    d.run_until_finished(last)
    assert s.continuum.pins.get("A") is None
    assert s.continuum.stats.releases_by_reason in ({"last_turn": 1}, {"resumed": 1})
    assert_all_free(d)


def test_reset_prefix_cache_releases_pins_and_succeeds(build):
    d = build()
    s = d.scheduler
    first_turn(d, "A")
    first_turn(d, "B", start=2000)
    assert s.reset_prefix_cache() is True
    assert len(s.continuum.pins) == 0
    assert s.continuum.stats.releases_by_reason == {"reset": 2}
    assert_all_free(d)


def test_shutdown_releases_everything(build):
    d = build()
    first_turn(d, "A")
    d.scheduler.shutdown()
    assert_all_free(d)


def test_invalid_hints_are_ignored_and_counted(build):
    d = build()
    s = d.scheduler
    bad = {"continuum_ttl_s": "nan", "continuum_tool": "x" * 10_000, "continuum_last_turn": [1]}
    turn = make_request(tokens(0, 64), session="A", xargs=bad)
    d.add(turn, tool_call_script(d))
    d.run_until_finished(turn)
    assert s.continuum.stats.invalid_hints == 3
    assert s.continuum.pins.get("A").ttl_s == s.continuum.config.default_ttl_s


def test_mixed_traffic_ends_with_every_block_free(build):
    d = build(num_blocks=48)
    requests = []
    for i in range(12):
        session = f"S{i % 4}" if i % 3 else None
        r = make_request(tokens(300 * i, 40 + 13 * i), session=session, max_tokens=12)
        requests.append(d.add(r, tool_call_script(d) if i % 2 else None))
        d.step()
    drain(d)
    assert_all_free(d)


def test_huge_session_ids_are_keyed_by_a_digest(build):
    d = build()
    s = d.scheduler
    t1 = first_turn(d, "x" * 100_000)
    (key,) = [p.session_id for p in s.continuum.pins]
    assert key.startswith("sha256:") and len(key) < 80
    t2 = next_turn(t1)
    d.add(t2, answer_script())
    assert admitted_hit(d, t2) >= (t1.num_prompt_tokens // BLOCK_SIZE) * BLOCK_SIZE
    assert s.continuum.stats.releases_by_reason == {"resumed": 1}


def test_one_session_pins_at_most_its_quota_and_keeps_its_prefix(build):
    d = build(num_blocks=64, settings={"max_session_pinned_fraction": 0.25})  # 15 of 63 blocks
    s = d.scheduler
    t1 = first_turn(d, "A", prompt_len=400)  # 26 blocks
    assert s.continuum.pins.get("A").num_blocks == 15
    assert audit(s)["pinned"] == 15
    t2 = next_turn(t1)
    d.add(t2, answer_script())
    # The pinned prefix is hit whole (the rest too while LRU has not evicted it).
    assert admitted_hit(d, t2) >= 15 * BLOCK_SIZE
