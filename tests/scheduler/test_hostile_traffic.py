"""Bounds that hold against every traffic, and clients that cannot hurt each
other (issue 46): each finding of the second review, on vLLM's real
scheduler, both builds, sync and async, requests stamped as vLLM stamps
them, beside stock vLLM on the same traffic where a wait is compared.

1. An earlier program whose pin expired is not starved by later programs
   cycling their pins: its turn bound starts whatever lane they come through,
   and also when later pins hold only part of what it needs.
2. A program whose turn runs, or waits, longer than the idle horizon is not
   forgotten: its next turn keeps the program's place.
3. A guessed session id cannot end, take over or reorder another's program,
   whether the guess arrives before or after the victim's first turn ends.
4. Fake tool calls of one tenant change no other tenant's TTLs.
5. Thousands of priority levels cost state only while they wait.
"""

from __future__ import annotations

import pytest
from vllm.v1.request import RequestStatus

from tests.scheduler.harness import EOS_TOKEN_ID, FILLER_TOKEN, make_request, tokens
from tests.scheduler.test_program_order import STEP_S, agents

TURN_BOUND_S = 2.0  # 20 steps of STEP_S
SLACK = 15  # steps: the turns already running finish, and blocks come back


def _send_next_turn(a, program, pause_steps: int, max_steps: int = 800):
    """Run until `program`'s first turn ended and its next turn was sent
    (`pause_steps` later): that request."""
    program.pause = pause_steps
    a.run(max_steps, until=lambda: program.turn == 1 and program.live is not None)
    assert program.live is not None, "its first turn never ended"
    return program.live


def _steps_to_admission(a, request, max_steps: int) -> int | None:
    sent = a.step_no
    a.run(max_steps, until=lambda: request.status != RequestStatus.WAITING)
    return a.step_no - sent if request.status != RequestStatus.WAITING else None


def _wait_for_next_turn(a, program, pause_steps: int, max_steps: int) -> int | None:
    """The steps `program`'s next turn waited to be admitted (None: never)."""
    return _steps_to_admission(a, _send_next_turn(a, program, pause_steps, max_steps), max_steps)


def _first_arrival(a, program) -> float:
    """Its program's first arrival on the scheduler's clock (it must be queued)."""
    return a.driver.scheduler.continuum.turns[program.live.request_id].program_arrival


# ------------------------------------------------------------------- finding 1
def _cycling(model_dir, async_scheduling, flavour, **settings):
    """Program 0 (300 tokens) arrives first; nine later programs of 112 tokens
    each (together more than the pool holds) cycle fast tools for ever: the
    next turn a step after the last, the same context every turn, each turn
    hinted the 300 s TTL that the middleware takes from Claude Code's
    `cache_control`."""
    a = agents(model_dir, async_scheduling, flavour,
               [(0, 2, 300), *[(2 + i, None, 112) for i in range(9)]], **settings)
    for later in a.programs[1:]:
        later.pause, later.grows, later.xargs = 1, False, {"continuum_ttl_s": 300}
    return a


def test_an_expired_agent_is_not_starved_by_later_programs_cycling_their_pins(
        tiny_model_dir, async_scheduling):
    """Program 0's tool outlasts max_ttl_s, so its pin expires; the later
    programs' turns continue their own pins (the pinned lane) and their pins
    never cover all it needs (their running turns hold the rest). Before,
    its turn bound never started: not admitted in 600 steps (stock: 3)."""
    waits = {}
    for flavour, settings in (("stock", {}), ("continuum", {"max_ttl_s": 3.0,
                                                            "max_turn_delay_s": TURN_BOUND_S})):
        a = _cycling(tiny_model_dir, async_scheduling, flavour, **settings)
        waits[flavour] = _wait_for_next_turn(a, a.programs[0], pause_steps=50, max_steps=600)
    print(f"\nsteps its next turn waited: {waits}")
    assert waits["stock"] is not None
    assert waits["continuum"] is not None, "starved behind later programs' pins"
    assert waits["continuum"] <= TURN_BOUND_S / STEP_S + SLACK, waits


# ------------------------------------------------------------------- finding 2
HORIZON_S = 2.0  # program_idle_horizon_s: 20 steps


@pytest.mark.parametrize("long_part", ["running", "queued"])
def test_a_program_busy_past_the_idle_horizon_keeps_its_place(tiny_model_dir, async_scheduling,
                                                              long_part):
    """The first program's first turn runs (decodes 60 steps) or waits (behind
    three earlier programs' long turns) longer than the idle horizon; then
    its tool outlasts max_ttl_s, so its pin expires. Its next turn is still
    its program's: it keeps the program's place ahead of the six programs
    that arrived after it, and waits no longer than on stock plus the turn
    bound. Before, the program was forgotten while busy, and its next turn
    queued as a new program behind every later one."""
    earlier = [] if long_part == "running" else [(0, 2, 300)] * 3
    specs = [(1, 2, 200), *earlier, *[(5 + i, 3, 160) for i in range(6)]]
    settings = {"max_ttl_s": 1.0, "program_idle_horizon_s": HORIZON_S,
                "max_turn_delay_s": TURN_BOUND_S}
    waits, places = {}, {}
    for flavour in ("stock", "continuum"):
        a = agents(tiny_model_dir, async_scheduling, flavour, specs,
                   **(settings if flavour == "continuum" else {}))
        program = a.programs[0]
        program.decode = 60 if long_part == "running" else 6
        for p in a.programs[1:1 + len(earlier)]:
            p.decode = 40
        if flavour == "continuum":
            a.run(5, until=lambda: program.live is not None)
            first = _first_arrival(a, program)
        second = _send_next_turn(a, program, pause_steps=30)
        if flavour == "continuum":
            turn = a.driver.scheduler.continuum.turns[second.request_id]
            places = {"program": first, "next turn": turn.program_arrival}
            assert turn.continues, "the program was forgotten while busy"
        waits[flavour] = _steps_to_admission(a, second, 800)
        a.run(800, until=lambda: program.ended is not None)
        assert program.ended is not None
    print(f"\nsteps its next turn waited: {waits}; places: {places}")
    assert places["next turn"] == places["program"]
    assert waits["continuum"] is not None
    assert waits["continuum"] <= waits["stock"] + TURN_BOUND_S / STEP_S + SLACK, waits


# ------------------------------------------------------------------- finding 3
@pytest.mark.parametrize("guess_arrives", ["before", "during"])
def test_a_guessed_id_cannot_end_another_programs_first_turn(tiny_model_dir, async_scheduling,
                                                            guess_arrives):
    """A stranger sends the victim's session id with `continuum_last_turn`
    (or Dynamo's `close`, which the middleware turns into it) before the
    victim's first request, or while it runs. The victim's program lives on:
    its next turn (after a tool that outlasts max_ttl_s, so no pin helps)
    continues it, in its place ahead of the six programs that arrived after
    it. Before, the guess counted as the program's first turn and ended it:
    the victim's next turn queued as a new program behind every later one."""
    a = agents(tiny_model_dir, async_scheduling, "continuum",
               [(2, 3, 120), *[(4 + i, 3, 160) for i in range(6)]], max_ttl_s=1.0)
    victim = a.programs[0]
    victim.name = "agent-42"
    c = a.driver.scheduler.continuum

    def guess():
        r = make_request(tokens(31337, 40), session="agent-42", max_tokens=4,
                         xargs={"continuum_last_turn": True})
        a.driver.add(r, [FILLER_TOKEN, EOS_TOKEN_ID])
        return r

    if guess_arrives == "before":
        a.run(1)
        stranger = guess()
        a.run(2)
    else:
        a.run(3)  # the victim's first turn is queued or running
        stranger = guess()
    assert victim.live is not None and not victim.live.is_finished()
    first = _first_arrival(a, victim)
    second = _send_next_turn(a, victim, pause_steps=30)
    assert stranger.is_finished()
    turn = c.turns[second.request_id]
    assert turn.continues, "the guess ended the victim's program"
    assert turn.program_arrival == first, "the victim lost its program's place"
    a.run(800, until=lambda: victim.ended is not None)
    assert victim.ended is not None


# ------------------------------------------------------------------- finding 5
def test_many_priority_levels_cost_only_while_they_wait(build):
    """`--scheduling-policy priority`: clients choose priorities. 2,800
    requests, each of its own level (half of them session turns), faster
    than the engine serves them: the bounds' marks and the queue's per-level heaps exist only
    for levels with requests waiting. Before, every level ever seen kept an
    entry that each admitting step walked (20,000 levels: 23.7 ms a step)."""
    d = build(policy="priority", num_blocks=64, max_num_seqs=4,
              settings={"ttl_policy": "hazard", "max_turn_delay_s": 60.0, "max_turn_aging_s": 60.0})
    s = d.scheduler
    rules, queue = s.continuum.queue, s.waiting
    levels = iter(range(10**6))
    most = busiest = 0
    for step in range(700):
        for k in range(4):
            level = next(levels)
            session = f"s{level}" if k % 2 else None
            d.add(make_request(tokens(50_000 + level, 40), session=session, max_tokens=3,
                               priority=level), [FILLER_TOKEN, FILLER_TOKEN, EOS_TOKEN_ID])
        d.step()
        d.advance(0.1)
        waiting_levels = {r.priority for r in queue}
        marked = max(len(b._latest) for b in (rules.bound, rules.turn_bound, rules.aging))
        assert marked <= len(waiting_levels) + 3, (step, marked, len(waiting_levels))
        assert len(queue._aging) <= 3 * len(waiting_levels), (step, len(queue._aging))
        most, busiest = max(most, marked), max(busiest, len(waiting_levels))
    print(f"\n2,800 levels sent; at most {most} levels marked and {busiest} waiting at once")
    assert busiest > 100  # the queue was busy
    for _ in range(2000):
        if not s.has_requests():
            break
        d.step()
        d.advance(0.1)
    assert not s.has_requests() and not len(queue._aging)
    assert all(len(b._latest) == 0 for b in (rules.bound, rules.turn_bound, rules.aging))


# ------------------------------------------------------------------- finding 4
def test_fake_calls_of_a_tool_do_not_switch_pinning_off_for_another_tenant(tiny_model_dir,
                                                                          async_scheduling):
    """One client sends 1,000 tiny requests, each under its own session id,
    hinted `continuum_tool: Bash`, never followed up. Six agents of another
    tenant (their own `cache_salt`, vLLM's tenant isolation) call Bash, whose
    calls return in a few steps, on a contested pool. Their TTL decisions are
    the same as without the flood, and their next turns find their context
    pinned as often, but for what the flood's own pins hold (under the caps,
    as earlier programs): tool statistics are kept per tenant
    (core/tool_stats.py). Before, the fake calls counted for everyone's Bash
    as calls out past the cap: the agents' pins got TTL 0 and none of their
    next turns found its context. Within one tenant the calls are pooled (the
    agents without a salt, the same flood): the bound is per tenant."""
    resumes, decisions = {}, {}
    for case in ("alone", "other tenant's flood", "same tenant's flood"):
        a = agents(tiny_model_dir, async_scheduling, "continuum",
                   [(5 + 2 * i, 6, 120) for i in range(6)], max_ttl_s=3.0)
        for p in a.programs:
            p.xargs, p.pause = {"continuum_tool": "Bash"}, 4
            p.salt = None if case == "same tenant's flood" else "tenant-a"
        if case != "alone":
            for i in range(1000):
                fake = make_request(tokens(200_000 + i, 8), session=f"fake-{i}", max_tokens=1,
                                    xargs={"continuum_tool": "Bash"})
                a.driver.add(fake, [FILLER_TOKEN])
        a.run(3000, until=lambda: all(p.ended is not None for p in a.programs))
        assert all(p.ended is not None for p in a.programs)
        stats = a.driver.scheduler.continuum.stats
        resumes[case] = dict(stats.resumes_by_outcome)
        # The agents' Bash pins let go at once (TTL 0) when the turn ended.
        decisions[case] = sum(1 for tool, ttl, _ in stats.ttl_decisions if tool == "Bash" and ttl == 0)
    print(f"\nthe agents' resumes: {resumes}; Bash pins given TTL 0: {decisions}")
    pinned = {f: r.get("pinned", 0) / max(1, sum(r.values())) for f, r in resumes.items()}
    assert decisions["alone"] == decisions["other tenant's flood"] == 0, decisions
    assert pinned["alone"] >= 0.9 and pinned["other tenant's flood"] >= 0.85, pinned
    assert pinned["same tenant's flood"] < pinned["alone"], pinned  # pooled within a tenant


