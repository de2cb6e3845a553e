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
from vllm_continuum.core.programs import ProgramTable
from vllm_continuum.core.ttl import TurnEnd
from vllm_continuum.core.ttl_policies import make_ttl_policy
from vllm_continuum.core.waiting_bound import WaitingBound
from vllm_continuum.core.waiting_queue import (
    AGING, PINNED, PREEMPTED, REGULAR, TURN_BOUND, WAITING_BOUND, LaneQueue,
)
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


def test_reloadable_pins_have_their_own_release_order():
    """Only reloadable pins, latest program first; a removed one is skipped."""
    table = PinTable()
    pins = {}
    for session, arrival, reloadable in [("a", 1, True), ("b", 3, False), ("c", 2, True), ("d", 4, True)]:
        pins[session] = pin(session, arrival=arrival)
        pins[session].reloadable = reloadable
        table.add(pins[session])
    assert [p.session_id for p in table.reloadable_release_order()] == ["d", "c", "a"]
    table.remove(pins["d"])
    assert [p.session_id for p in table.reloadable_release_order()] == ["c", "a"]


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


# ------------------------------------------------------- programs and tools
def _arrive(table: ProgramTable, session: str, now: float, hashes: list):
    """A request of `session` arrives: (its program, whether it continues it,
    the duration its program's last call measured)."""
    program = table.continued_by(session, hashes)
    continues = program is not None
    if program is None:
        program = table.open(session, now, now)
    return program, continues, table.arrive(program, now)


def _end_turn(table: ProgramTable, program, now: float, tool, hashes: list) -> None:
    table.turn_ended(program, now, tool, Anchor(len(hashes), hashes[-1]) if hashes else None)
    table.left(program)


def test_the_program_table_is_bounded_and_keeps_program_arrival():
    table = ProgramTable(max_programs=2)
    a, _, _ = _arrive(table, "a", 0, ["h1"])
    _end_turn(table, a, 0.5, "t", ["h1"])
    again, continues, _ = _arrive(table, "a", 1, ["h1", "h2"])
    assert again is a and continues and a.arrival == 0  # its first request's
    b, _, _ = _arrive(table, "b", 2, [])
    c, _, _ = _arrive(table, "c", 3, [])
    # Programs whose first turn has not ended go first: "a"'s did, so "b" is forgotten.
    assert a in table and b not in table and len(table) == 2
    _end_turn(table, c, 4, "t", ["c1"])
    _arrive(table, "d", 5, [])  # both paused: the least recent goes
    assert a not in table and c in table


def test_a_flood_of_fresh_ids_cannot_push_a_working_program_out():
    table = ProgramTable(max_programs=4)
    agent, _, _ = _arrive(table, "agent", 1.0, ["h1"])
    _end_turn(table, agent, 2.0, "search", ["h1"])
    for i in range(1000):  # fresh ids, each aborted at once (no turn ends)
        flood, _, _ = _arrive(table, f"flood-{i}", 3.0, [])
        table.left(flood)
    again, continues, measured = _arrive(table, "agent", 4.0, ["h1", "h2"])
    assert again is agent and continues and measured == ("search", 2.0)
    assert len(table) <= 4 and agent.arrival == 1.0


def test_a_flood_of_cheap_finished_turns_cannot_push_a_paused_agent_out():
    """One-token session turns that finish (no tool call) are forgotten before
    an agent whose last turn called a tool: it keeps its place and its
    measured duration when it comes back, however long the flood."""
    table = ProgramTable(max_programs=4)
    agent, _, _ = _arrive(table, "agent", 1.0, ["h1"])
    _end_turn(table, agent, 2.0, "run_tests", ["h1"])
    for i in range(1000):
        cheap, _, _ = _arrive(table, f"cheap-{i}", 3.0, [f"c{i}"])
        _end_turn(table, cheap, 3.0, None, [f"c{i}"])
    again, continues, measured = _arrive(table, "agent", 40.0, ["h1", "h2"])
    assert again is agent and continues and measured == ("run_tests", 38.0) and len(table) == 4


def test_tool_duration_is_next_arrival_minus_turn_end():
    table = ProgramTable(max_programs=10)
    a, _, _ = _arrive(table, "a", 10.0, ["h1"])
    _end_turn(table, a, 11.0, "search", ["h1"])
    _, continues, measured = _arrive(table, "a", 13.5, ["h1", "h2"])
    assert measured == ("search", 2.5) and a.turns == 1 and continues
    assert _arrive(table, "a", 14, ["h1"])[2] is None  # measured once
    _end_turn(table, a, 15.0, None, ["h1"])  # no tool call
    assert _arrive(table, "a", 16, ["h1"])[2] is None


def test_a_request_that_only_carries_the_session_id_opens_its_own_program():
    """Another prefix: no duration learned, no inherited place in the queue;
    its own last turn ends its own program, never the other one."""
    table = ProgramTable(max_programs=10)
    a, _, _ = _arrive(table, "a", 1.0, ["h1"])
    _end_turn(table, a, 2.0, "search", ["h1"])
    stranger, continues, measured = _arrive(table, "a", 3.0, ["x1", "x2"])
    assert stranger is not a and not continues and measured is None and stranger.arrival == 3.0
    table.turn_ended(stranger, 3.5, None, Anchor(2, "x2"))
    table.end(stranger)  # its last turn
    again, continues, measured = _arrive(table, "a", 4.0, ["h1", "h2"])
    assert again is a and continues and measured == ("search", 2.0) and a.arrival == 1.0


def test_a_guess_before_the_first_turn_ends_is_a_program_of_its_own():
    """Two requests with one id, neither continuing anything: two programs.
    The second one's last turn ends only the second."""
    table = ProgramTable(max_programs=10)
    victim, _, _ = _arrive(table, "agent-42", 1.0, ["v1"])
    guess, continues, _ = _arrive(table, "agent-42", 2.0, ["g1"])
    assert guess is not victim and not continues
    table.turn_ended(guess, 2.5, None, Anchor(1, "g1"))
    assert table.end(guess) == 1
    _end_turn(table, victim, 3.0, "bash", ["v1"])
    again, continues, measured = _arrive(table, "agent-42", 4.0, ["v1", "v2"])
    assert again is victim and continues and measured == ("bash", 1.0)


def test_programs_end_by_hint_or_idleness():
    table = ProgramTable(max_programs=10)
    a, _, _ = _arrive(table, "a", 0.0, ["a1"])
    _end_turn(table, a, 1.0, "t", ["a1"])
    b, _, _ = _arrive(table, "b", 5.0, ["b1"])
    _end_turn(table, b, 6.0, "t", ["b1"])
    assert table.pop_idle(now=8.0, horizon_s=5) == [1]  # a
    # A program with a request queued or running, or a pinned context, is not idle.
    b.pins = 1
    running, _, _ = _arrive(table, "r", 6.0, ["r1"])
    assert table.pop_idle(now=20.0, horizon_s=5) == []
    assert table.end(b) == 1 and table.end(running) == 0


def test_an_idle_program_keeps_its_place_for_its_next_turn():
    """Idle past the horizon, a program counts as ended (eta) but stays in the
    table: its next turn still continues it, in its place."""
    table = ProgramTable(max_programs=10)
    a, _, _ = _arrive(table, "a", 0.0, ["a1"])
    _end_turn(table, a, 1.0, "approval", ["a1"])
    assert table.pop_idle(now=700.0, horizon_s=600) == [1] and a in table
    again, continues, measured = _arrive(table, "a", 900.0, ["a1", "a2"])
    assert again is a and continues and a.arrival == 0.0 and measured == ("approval", 899.0)
    assert table.pop_idle(now=901.0, horizon_s=600) == []


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
    bound.prune(lambda level: 3.5)
    assert bound.extra_since(3.5, 0) == 14.0  # the mark of enqueue time 4
    assert len(bound._latest[0]) == 2
    bound.went_ahead(9.0, level=7, now=20.0)
    bound.prune(lambda level: None if level == 7 else 3.5)  # nobody waits at level 7
    assert bound.num_levels == 1


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
    assert q.first_of(WAITING_BOUND, 0) is None


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
    assert [q.first_of(b, 0) for b in (WAITING_BOUND, TURN_BOUND, AGING)] == [1, 2, 2]
    assert q.pop_request().name == "early"
    overdue.add("late")  # the oldest is the first to be overdue (waiting_bound.py)
    assert [r.name for r in q] == ["late", "turn", "later"]
