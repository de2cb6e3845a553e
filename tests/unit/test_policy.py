"""The pure policy pieces, without vLLM: hints, TTL policies, pin table,
lane queue, session registry."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_continuum.config import ContinuumConfig
from vllm_continuum.core.hints import NO_HINTS, parse_hints
from vllm_continuum.core.pin_table import Anchor, Pin, PinTable
from vllm_continuum.core.pressure import PressureRule, blocks_freed, pins_to_release
from vllm_continuum.core.sessions import SessionRegistry
from vllm_continuum.core.ttl import TurnEnd, make_ttl_policy
from vllm_continuum.core.waiting_bound import WaitingBound
from vllm_continuum.core.waiting_queue import PINNED, PREEMPTED, REGULAR, LaneQueue
from vllm_continuum.core.workload import WorkloadModel


# ------------------------------------------------------------------- hints
def test_valid_hints():
    h = parse_hints(
        {"continuum_tool": "search", "continuum_ttl_s": "2.5", "continuum_last_turn": 1}, 128
    )
    assert (h.tool, h.ttl_s, h.last_turn, h.invalid) == ("search", 2.5, True, ())


def test_no_hints_is_shared():
    assert parse_hints(None, 128) is NO_HINTS
    assert parse_hints({"other": 1}, 128) is NO_HINTS


@pytest.mark.parametrize(
    "xargs, invalid",
    [
        ({"continuum_ttl_s": float("nan")}, ("continuum_ttl_s",)),
        ({"continuum_ttl_s": float("inf")}, ("continuum_ttl_s",)),
        ({"continuum_ttl_s": -1}, ("continuum_ttl_s",)),
        ({"continuum_ttl_s": True}, ("continuum_ttl_s",)),
        ({"continuum_ttl_s": [1]}, ("continuum_ttl_s",)),
        ({"continuum_tool": ""}, ("continuum_tool",)),
        ({"continuum_tool": "x" * 129}, ("continuum_tool",)),
        ({"continuum_tool": "a\nb"}, ("continuum_tool",)),
        ({"continuum_tool": 3}, ("continuum_tool",)),
        ({"continuum_last_turn": 2}, ("continuum_last_turn",)),
        ({"continuum_last_turn": "maybe"}, ("continuum_last_turn",)),
    ],
)
def test_invalid_hints_are_dropped_one_by_one(xargs, invalid):
    h = parse_hints({**xargs, "continuum_tool": xargs.get("continuum_tool", "ok")}, 128)
    assert h.invalid == invalid
    assert h.tool == (None if "continuum_tool" in invalid else "ok")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3),
    max_leaves=8,
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["continuum_tool", "continuum_ttl_s", "continuum_last_turn", "x"]), json_values))
def test_parse_hints_never_raises_and_yields_sane_values(xargs):
    h = parse_hints(xargs, 128)
    assert h.ttl_s is None or (math.isfinite(h.ttl_s) and h.ttl_s >= 0)
    assert h.tool is None or 0 < len(h.tool) <= 128
    assert isinstance(h.last_turn, bool)


# --------------------------------------------------------------------- ttl
def turn(tool="t", hint=None, context=10):
    return TurnEnd("s", tool, num_context_tokens=context, hinted_ttl_s=hint)


def workload():
    return WorkloadModel(history_limit=100, queueing_window=4, program_window=100)


def test_fixed_policy_order_hint_tool_default_and_cap():
    policy = make_ttl_policy(
        ContinuumConfig(
            ttl_policy="fixed", default_ttl_s=2, tool_ttl_s={"slow": 50}, max_ttl_s=10
        ),
        workload(),
    )
    assert (policy.decide(turn()).ttl_s, policy.decide(turn()).source) == (2, "default")
    assert policy.decide(turn("slow")).ttl_s == 10
    assert policy.decide(turn("slow")).source == "tool+cap"
    assert policy.decide(turn("slow", hint=3)).ttl_s == 3


def test_never_policy_ignores_hints():
    policy = make_ttl_policy(ContinuumConfig(ttl_policy="never"), workload())
    assert policy.decide(turn(hint=5)).ttl_s == 0


# --------------------------------------------------------------- pin table
def pin(session, arrival=0.0, expires=10.0, n=2, ids=None, hashes=None, request=None):
    ids = tuple(ids) if ids is not None else tuple(range(n))
    hashes = tuple(hashes) if hashes is not None else ()
    return Pin(
        session, request or f"r-{session}-{next(_PIN_NO)}", "t", [object()] * len(ids), ids,
        0.0, expires, arrival, anchor=Anchor.of(hashes, len(hashes)), hashes=hashes,
    )


_PIN_NO = itertools.count()


def test_pin_table_counts_distinct_blocks():
    """Two sessions sharing an 18-block system prompt: 22 distinct blocks, not 40."""
    table = PinTable()
    system = list(range(18))
    table.add(pin("a", ids=system + [100, 101]))
    assert table.marginal(system + [200, 201]) == 2
    b = pin("b", ids=system + [200, 201])
    table.add(b)
    assert table.num_pinned_blocks == 22 and len(table) == 2
    assert table.share(b) == pytest.approx(9 + 2)  # half of each shared block
    assert sum(table.share(p) for p in table) == pytest.approx(22)
    assert table.count_with([300], without=[b]) == 21
    table.remove(b)
    assert table.num_pinned_blocks == 20 and not table.remove(b)


def test_a_pin_belongs_to_its_prefix():
    table = PinTable()
    a = pin("s", hashes=["h1", "h2", "h3"])
    fork = pin("s", hashes=["h1", "x2"])
    table.add(a)
    table.add(fork)
    assert table.pin_continued_by("s", ["h1", "h2", "h3", "h4"]) is a
    assert table.pin_continued_by("s", ["h1", "x2", "x3"]) is fork
    assert table.pin_continued_by("s", ["h1", "h2"]) is None  # stops short of the anchor
    assert table.pin_continued_by("other", ["h1", "h2", "h3"]) is None  # not its session
    assert table.pin_continued_by("s", ["z1", "z2", "z3"]) is None  # same id, other prefix
    assert table.pins_subsumed_by("s", ["h1", "h2", "h3", "h4"]) == [a]
    assert table.get("s") is fork and table.of_session("s") == [a, fork]


def test_anchor_is_the_last_hash_of_the_prefix():
    anchor = Anchor.of(["h1", "h2", "h3"], 2)
    assert anchor == Anchor(2, "h2")
    assert anchor.continued_by(["h1", "h2"]) and not anchor.continued_by(["h1"])
    assert Anchor.of([], 3) is None and Anchor.of(["h1"], 0) is None


def test_expired_is_lazy_and_skips_released_pins():
    table = PinTable()
    a = pin("a", expires=5)
    table.add(a)
    table.add(pin("b", expires=7))
    table.remove(a)
    a2 = pin("a", expires=50)
    table.add(a2)
    assert table.expired(4) == []
    assert [p.session_id for p in table.expired(8)] == ["b"]
    assert table.get("b") is not None  # reported, not removed
    table.remove(table.get("b"))
    assert table.expired(60) == [a2]


def test_release_order_latest_program_first():
    table = PinTable()
    for session, arrival in [("a", 1), ("b", 3), ("c", 2)]:
        table.add(pin(session, arrival=arrival))
    assert [p.session_id for p in table.release_order()] == ["b", "c", "a"]


# ------------------------------------------------------------- pressure choice
def test_pins_to_release_takes_the_fewest_that_cover_the_shortfall():
    later, mid, early = pin("c", ids=[1, 2, 3]), pin("b", ids=[4, 5]), pin("a", ids=[6])
    refs = lambda b: 1  # noqa: E731  (held by the pin alone)
    assert pins_to_release([later, mid, early], 2, refs) == [later]
    assert pins_to_release([later, mid, early], 4, refs) == [later, mid]
    assert pins_to_release([later, mid, early], 7, refs) == []  # not enough: none
    assert pins_to_release([later, mid, early], None, refs) == [later, mid, early]


def test_shared_blocks_are_freed_only_with_their_last_pin():
    a, b = pin("a", ids=[1, 2]), pin("b", ids=[1, 2, 3])
    refs = {1: 2, 2: 2, 3: 1}.get
    assert blocks_freed([a], refs) == 0 and blocks_freed([a, b], refs) == 3
    assert pins_to_release([a, b], 2, refs) == [a, b]
    assert pins_to_release([a, b], 1, refs) == [b]  # a pruned: b alone frees block 3
    # A block a running request also holds (one more reference) frees nothing;
    # neither does one in the requester's own prefix hit.
    assert blocks_freed([b], {1: 2, 2: 2, 3: 2}.get) == 0
    assert blocks_freed([a, b], refs, keep={3}) == 2


@pytest.mark.parametrize(
    "policy, running_request, anything_running, preempted, overdue, expected",
    [
        ("hold", False, True, False, False, False),  # hold: waiting work waits
        ("hold", False, False, False, False, True),  # the deadlock guard
        ("hold", True, True, False, False, True),  # never preempt for a pin
        ("hold", False, True, True, False, True),  # a preempted head already lost its KV
        ("hold", False, True, False, True, True),  # the waiting bound
        ("yield", False, True, False, False, True),
    ],
)
def test_may_release_pins(policy, running_request, anything_running, preempted, overdue, expected):
    assert PressureRule.named(policy).may_release_pins(
        running_request, anything_running, preempted=preempted, overdue=overdue
    ) is expected


def test_pressure_policy_is_checked_once():
    with pytest.raises(ValueError, match="pressure_policy"):
        PressureRule.named("hodl")


# -------------------------------------------------------------- lane queue
@dataclass(eq=False)
class Req:
    name: str
    arrival: float
    session: str | None = None
    preempted: bool = False


def make_queue(pinned: set[str]):
    return LaneQueue(
        lane_of=lambda r: PREEMPTED if r.preempted else PINNED if r.session in pinned else REGULAR,
        key_of=lambda r: (r.arrival, r.name),
    )


def drain(queue):
    out = []
    while queue:
        assert queue.peek_request() is (r := queue.pop_request())
        out.append(r.name)
    return out


def test_lanes_preempted_then_pinned_then_arrival():
    pinned = {"s"}
    q = make_queue(pinned)
    for r in [Req("a", 1), Req("b", 2, "s"), Req("c", 0.5), Req("d", 3, "s")]:
        q.add_request(r)
    q.prepend_request(Req("p", 9, preempted=True))
    assert [r.name for r in q] == ["p", "b", "d", "c", "a"]
    assert drain(q) == ["p", "b", "d", "c", "a"]


def test_skipped_requests_keep_their_place():
    q = make_queue(set())
    reqs = [Req(n, i) for i, n in enumerate("abc")]
    for r in reqs:
        q.add_request(r)
    skipped = [q.pop_request(), q.pop_request()]
    q.prepend_requests(reversed(skipped))  # vLLM hands them back newest first
    assert drain(q) == ["a", "b", "c"]


def test_requeue_moves_a_request_between_lanes():
    pinned: set[str] = set()
    q = make_queue(pinned)
    q.add_request(Req("a", 1))
    q.add_request(b := Req("b", 2, "s"))
    pinned.add("s")
    q.requeue(b)
    assert [r.name for r in q] == ["b", "a"]
    pinned.clear()
    q.requeue(b)
    q.requeue(Req("ghost", 0, "s"))  # not queued: nothing
    assert [r.name for r in q] == ["a", "b"]


def test_removing_requests_it_does_not_hold_is_harmless():
    q = make_queue(set())
    a = Req("a", 1, "s")
    q.add_request(a)
    q.remove_requests([Req("ghost", 0, "s")])
    assert a in q and len(q) == 1
    q.remove_request(a)
    assert not q and a not in q


def test_length_is_counted_through_every_operation():
    """len() is a counter, not a recount: it must follow every way in and out."""
    pinned: set[str] = set()
    q = make_queue(pinned)
    reqs = [Req(f"r{i}", i, session="s" if i % 2 else None) for i in range(6)]
    for r in reqs[:4]:
        q.add_request(r)
    q.prepend_request(Req("p", 9, preempted=True))
    q.prepend_requests([reqs[4], reqs[5]])
    assert len(q) == len(list(q)) == 7
    pinned.add("s")
    for r in reqs:
        q.requeue(r)
    q.remove_requests([reqs[1], Req("ghost", 0, "s")])
    assert len(q) == len(list(q)) == 6
    q.pop_request()
    q.pop_request()
    assert len(q) == len(list(q)) == 4
    drain(q)
    assert len(q) == 0 and not q


# ------------------------------------------------------- sessions and tools
def test_session_registry_is_bounded_and_keeps_program_arrival():
    reg = SessionRegistry(max_sessions=2)
    reg.observe_arrival("a", now=0, hashes=["h1"])
    reg.observe_turn_end("a", now=0.5, tool="t", anchor=Anchor(1, "h1"))
    reg.observe_arrival("a", now=1, hashes=["h1", "h2"])
    assert reg.program_arrival("a", default=-1) == 0  # its first request's
    reg.observe_arrival("b", now=2, hashes=[])
    reg.observe_arrival("c", now=3, hashes=[])
    # Sessions that never finished a turn go first: "a" did, so "b" is forgotten.
    assert "a" in reg and "b" not in reg and len(reg) == 2
    reg.observe_turn_end("c", now=4, tool="t", anchor=None)
    reg.observe_arrival("d", now=5, hashes=[])  # both paused: the least recent goes
    assert "a" not in reg and "c" in reg and "d" in reg


def test_a_flood_of_fresh_ids_cannot_push_a_working_session_out():
    reg = SessionRegistry(max_sessions=4)
    reg.observe_arrival("agent", now=1.0, hashes=["h1"])
    reg.observe_turn_end("agent", now=2.0, tool="search", anchor=Anchor(1, "h1"))
    for i in range(1000):  # fresh ids, each aborted at once (no turn ends)
        reg.observe_arrival(f"flood-{i}", now=3.0, hashes=[])
    agent = reg.observe_arrival("agent", now=4.0, hashes=["h1", "h2"])
    assert agent.continues and agent.measured == ("search", 2.0) and len(reg) == 4
    assert reg.program_arrival("agent", default=0) == 1.0


def test_a_flood_of_cheap_finished_turns_cannot_push_a_paused_agent_out():
    """One-token session turns that finish (no tool call) are forgotten before
    an agent whose last turn called a tool: it keeps its place and its
    measured duration when it comes back, however long the flood."""
    reg = SessionRegistry(max_sessions=4)
    reg.observe_arrival("agent", now=1.0, hashes=["h1"])
    reg.observe_turn_end("agent", now=2.0, tool="run_tests", anchor=Anchor(1, "h1"))
    for i in range(1000):
        reg.observe_arrival(f"cheap-{i}", now=3.0, hashes=[f"c{i}"])
        reg.observe_turn_end(f"cheap-{i}", now=3.0, tool=None, anchor=Anchor(1, f"c{i}"))
    agent = reg.observe_arrival("agent", now=40.0, hashes=["h1", "h2"])
    assert agent.continues and agent.measured == ("run_tests", 38.0) and len(reg) == 4
    assert reg.program_arrival("agent", default=-1) == 1.0


def test_tool_duration_is_next_arrival_minus_turn_end():
    reg = SessionRegistry(max_sessions=10)
    reg.observe_arrival("a", now=10.0, hashes=["h1"])
    reg.observe_turn_end("a", now=11.0, tool="search", anchor=Anchor(1, "h1"))
    arrival = reg.observe_arrival("a", now=13.5, hashes=["h1", "h2"])
    assert arrival.measured == ("search", 2.5) and arrival.state.turns == 1 and arrival.continues
    assert reg.observe_arrival("a", now=14, hashes=["h1"]).measured is None  # measured once
    reg.observe_turn_end("a", now=15.0, tool=None, anchor=Anchor(1, "h1"))  # no tool call
    assert reg.observe_arrival("a", now=16, hashes=["h1"]).measured is None


def test_a_request_that_only_carries_the_session_id_does_not_speak_for_it():
    """Another prefix: no duration learned, no inherited place in the queue."""
    reg = SessionRegistry(max_sessions=10)
    reg.observe_arrival("a", now=1.0, hashes=["h1"])
    reg.observe_turn_end("a", now=2.0, tool="search", anchor=Anchor(1, "h1"))
    stranger = reg.observe_arrival("a", now=3.0, hashes=["x1", "x2"])
    assert not stranger.continues and not stranger.first_turn and stranger.measured is None
    agent = reg.observe_arrival("a", now=4.0, hashes=["h1", "h2"])
    assert agent.continues and agent.measured == ("search", 2.0)
    assert reg.program_arrival("a", default=0) == 1.0


def test_programs_end_by_hint_or_idleness():
    reg = SessionRegistry(max_sessions=10)
    for session, now in [("a", 0.0), ("b", 5.0)]:
        reg.observe_arrival(session, now=now, hashes=[])
        reg.observe_turn_end(session, now=now + 1, tool="t", anchor=None)
    assert reg.pop_idle(now=8.0, horizon_s=5) == [("a", 1)]
    # A session whose context is pinned is running a tool, not idle.
    assert reg.pop_idle(now=20.0, horizon_s=5, busy=lambda s: s == "b") == []
    assert reg.end_program("b") == 1 and len(reg) == 0


def test_a_prompt_anchors_all_but_its_last_full_block():
    """The next turn's tokenizer may re-cut the previous prompt's last tokens
    where the new text joins: that block is not required."""
    hashes = ["h1", "h2", "h3", "h4"]
    assert Anchor.of_prompt(hashes, 3) == Anchor(2, "h2")
    assert Anchor.of_prompt(hashes, 1) == Anchor(1, "h1")
    assert Anchor.of_prompt(hashes, 0) is None


# ------------------------------------------------------------- waiting bound
def test_extra_wait_begins_when_a_later_arrival_goes_ahead():
    bound = WaitingBound(max_delay_s=2.0)
    # r1 enqueued at 1, r2 at 2. Admitting r0 (enqueued at 0.5) passes nobody.
    bound.went_ahead(0.5, level=0, now=3.0)
    assert bound.extra_since(1.0, 0) is None
    # A turn enqueued at 1.5 goes first: r1 is passed at t=4, r2 is not.
    bound.went_ahead(1.5, level=0, now=4.0)
    assert bound.extra_since(1.0, 0) == 4.0 and bound.extra_since(2.0, 0) is None
    assert not bound.overdue(1.0, 0, now=5.9) and bound.overdue(1.0, 0, now=6.0)
    # Saturation alone (nobody later went ahead) never makes anyone overdue.
    assert not bound.overdue(2.0, 0, now=1e6)
    # Another priority level is another queue.
    assert bound.extra_since(1.0, level=1) is None


def test_pins_holding_the_head_back_start_the_clock_for_everyone_waiting():
    bound = WaitingBound(max_delay_s=1.0)
    bound.held_by_pins(level=0, now=10.0)
    assert bound.extra_since(4.0, 0) == 10.0 and bound.extra_since(9.9, 0) == 10.0
    assert bound.extra_since(10.5, 0) is None  # arrived after: its own wait is to come


def test_pruned_marks_no_waiting_request_needs():
    bound = WaitingBound(max_delay_s=1.0)
    for t in range(1, 6):
        bound.went_ahead(float(t), level=0, now=10.0 + t)
    bound.prune(oldest_waiting=3.5)
    assert bound.extra_since(3.5, 0) == 14.0  # the mark of enqueue time 4
    assert len(bound._latest[0]) == 2


def test_an_overdue_request_goes_first_behind_preempted_ones_only():
    overdue: set[str] = set()
    pinned = {"s"}
    q = LaneQueue(
        lane_of=lambda r: PREEMPTED if r.preempted else PINNED if r.session in pinned else REGULAR,
        key_of=lambda r: (r.arrival, r.name),
        enqueued_at=lambda r: r.arrival,
        overdue=lambda r: r.name in overdue,
    )
    for r in [Req("old", 1), Req("turn", 3, "s"), Req("new", 2)]:
        q.add_request(r)
    assert [r.name for r in q] == ["turn", "old", "new"]
    overdue.add("old")
    assert q.peek_request().name == "old" and [r.name for r in q] == ["old", "turn", "new"]
    q.prepend_request(Req("p", 9, preempted=True))
    assert drain(q) == ["p", "old", "turn", "new"]
    assert q.oldest_enqueued_at() is None


def test_a_pop_returns_what_the_last_peek_returned():
    """vLLM peeks, works on the request (time passes, its status changes), then
    pops: the pop must return the peeked request even if the order moved."""
    overdue: set[str] = set()
    q = LaneQueue(
        lane_of=lambda r: REGULAR, key_of=lambda r: (r.arrival, r.name),
        enqueued_at=lambda r: r.arrival,
        overdue=lambda r: r.name in overdue,
    )
    for r in [Req("old", 1), Req("new", 0.5)]:  # keyed by arrival: "new" first
        q.add_request(r)
    assert q.peek_request().name == "new"
    overdue.add("old")  # crosses the bound while vLLM allocates "new"
    assert q.pop_request().name == "new"
    assert q.peek_request().name == "old"  # the next peek sees the new order
    q.add_request(Req("x", 5))  # a push in between: the pop follows the order again
    assert q.pop_request().name == "old"


def test_it_reads_like_vllms_fcfs_deque():
    q = make_queue({"s"})
    reqs = [Req("a", 1), Req("b", 2, "s"), Req("c", 0.5)]
    for r in reqs:
        q.add_request(r)
    assert [q[i].name for i in range(len(q))] == [r.name for r in q] == ["b", "c", "a"]
    assert q[-1].name == "a" and q[0] is q.peek_request()
    assert reqs[0] in q and Req("a", 1) not in q
    with pytest.raises(IndexError):
        q[3]


def test_an_aged_turn_goes_before_later_one_shots_that_are_not_overdue():
    """Requests without a session go first (sessionless_first), but the
    oldest aged turn goes before those that arrived after it; not before an
    earlier one-shot, nor an overdue one."""
    aged: set[str] = set()
    overdue: set[str] = set()
    q = LaneQueue(
        lane_of=lambda r: REGULAR,
        key_of=lambda r: (r.session is not None, r.arrival, r.name),
        enqueued_at=lambda r: r.arrival,
        has_waiting_bound=lambda r: r.session is None,
        place_of=lambda r: r.arrival,
        overdue=lambda r: r.name in overdue,
        aged=lambda r: r.name in aged,
    )
    for r in [Req("early", 1), Req("turn", 2, "s"), Req("late", 3), Req("later", 4)]:
        q.add_request(r)
    assert [r.name for r in q] == ["early", "late", "later", "turn"]
    aged.add("turn")
    assert [r.name for r in q] == ["early", "turn", "late", "later"]
    assert q.firsts() == (1, 2, 2)
    assert q.pop_request().name == "early"
    overdue.add("late")  # the oldest is the first to be overdue (waiting_bound.py)
    assert [r.name for r in q] == ["late", "turn", "later"]
