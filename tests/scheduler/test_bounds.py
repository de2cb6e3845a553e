"""Every request's bound under hostile traffic, scheduler level, both vLLM
builds, sync and async (docs/guarantees.md). Requests carry vLLM's
wall-clock `arrival_time`; the scheduler runs on its own clock (harness).

- an earlier program's turn whose pin expired is not held behind later
  programs' pins for longer than the turn bound (`max_turn_delay_s`);
- a session's turn is not passed forever by a flood of requests without a
  session (its aging, `max_turn_aging_s`);
- an overdue request without a session goes first even when an older one is
  parked (its grammar compiling);
- the precedence cap fires on vLLM's real timestamps
  (test_program_order.py::test_an_endless_session_does_not_starve_a_new_program).
"""

from __future__ import annotations

from vllm.v1.request import RequestStatus

from tests.scheduler.harness import (
    FILLER_TOKEN, EOS_TOKEN_ID, WALL_CLOCK, Driver, FakeClock, make_request, make_scheduler, tokens,
)
from tests.scheduler.test_program_order import STEP_S, Program, agents

TURN_BOUND_S = 2.0  # 20 steps of STEP_S
SLACK = 15  # steps: the turns already running finish, and blocks come back


def test_core_never_reads_vllms_wall_clock():
    """One clock: the core compares only times of the controller's clock."""
    from pathlib import Path

    import vllm_continuum.core as core

    for path in Path(core.__file__).parent.glob("*.py"):
        assert "arrival_time" not in path.read_text(), path.name


def test_a_requests_time_on_the_way_counts(tiny_model_dir, async_scheduling):
    """vLLM's stamp is converted once: a request that took 2 s to reach the
    engine core counts as 2 s old, and so goes before one stamped after it
    but added first (vLLM's priority queue orders by the stamp too)."""
    s = make_scheduler(tiny_model_dir, async_scheduling=async_scheduling)
    s.continuum.clock = FakeClock()
    d, now = Driver(s), s.continuum.now()
    early = make_request(tokens(1, 20), session="A")
    WALL_CLOCK.advance(2.0)
    late = make_request(tokens(2, 20), session="B")
    d.add(late)
    d.add(early)  # stamped 2 s before `late`, added after it
    arrived = {r.request_id: s.continuum.turns[r.request_id].arrival for r in (early, late)}
    assert abs(arrived[late.request_id] - now) < 1e-3
    assert abs(arrived[early.request_id] - (now - 2.0)) < 1e-3
    d.advance(5.0)
    slow = make_request(tokens(3, 20), session="C")
    WALL_CLOCK.advance(2.0)
    d.add(slow)
    assert abs(s.continuum.turns[slow.request_id].arrival - (now + 5.0 - 2.0)) < 1e-3


def test_an_expired_agent_is_not_held_behind_later_programs_pins(tiny_model_dir, async_scheduling):
    """The first program's tool outlasts max_ttl_s: its pin expires, and later
    programs keep the pool full of pins they cycle. Its next turn is admitted
    within the turn bound, plus the turns then running."""
    settings = {"max_ttl_s": 3.0, "max_turn_delay_s": TURN_BOUND_S}
    later = [(2 + i, None, 300) for i in range(6)]  # endless, 19 blocks each: the pool is full
    a = agents(tiny_model_dir, async_scheduling, "continuum", [(0, 2, 300), *later], **settings)
    first = a.programs[0]
    first.pause = 50  # 5 s: longer than max_ttl_s
    a.run(400, until=lambda: first.turn == 1 and first.live is not None)
    assert first.live is not None, "the first turn never ended"
    sent = a.step_no
    second = first.live
    a.run(400, until=lambda: second.status != RequestStatus.WAITING)
    waited = a.step_no - sent
    assert second.status != RequestStatus.WAITING, "its next turn starved behind later pins"
    assert waited <= TURN_BOUND_S / STEP_S + SLACK, waited


def test_a_sessionless_flood_does_not_starve_an_agent(tiny_model_dir, async_scheduling):
    """Requests without a session arrive faster than the engine serves them
    (and go before session turns: sessionless_first). An agent's first turn is
    admitted within the turn bound, plus the flood that arrived before it."""
    a = agents(tiny_model_dir, async_scheduling, "continuum", [(5, 2, 64)],
               max_turn_aging_s=TURN_BOUND_S)
    agent = a.programs[0]

    sent = iter(range(10**6))

    def flood_step():
        for _ in range(3):  # 3 x 240 distinct tokens a step against a budget of 512
            one_shot = make_request(tokens(100_000 + next(sent), 240), max_tokens=4)
            a.driver.add(one_shot, [FILLER_TOKEN, EOS_TOKEN_ID])
        a.run(1)

    for _ in range(300):
        flood_step()
        if agent.first_admitted is not None:
            break
    backlog = len(a.driver.scheduler.waiting)
    print(f"\nagent admitted at step {agent.first_admitted}, {backlog} requests waiting")
    assert agent.first_admitted is not None, "the flood starved the agent"
    assert agent.first_admitted - 5 <= TURN_BOUND_S / STEP_S + 2 * SLACK, agent.first_admitted


def test_an_overdue_request_goes_first_while_an_older_one_is_parked(build):
    """The oldest request without a session waits for its grammar (parked).
    A younger one is overdue behind a next turn that cannot fit while another
    session's pin holds memory (hold): the younger one goes first, and fits."""
    d = build(num_blocks=24, settings={"max_queue_delay_s": 0.5, "pressure_policy": "hold",
                                       "default_ttl_s": 30.0})
    s = d.scheduler
    tool = s.structured_output_manager.tokenizer.get_vocab()["<tool_call>"]
    script = [FILLER_TOKEN, tool, FILLER_TOKEN, EOS_TOKEN_ID]
    a = d.add(make_request(tokens(1, 100), session="A", max_tokens=8), script)  # 7 blocks
    b = d.add(make_request(tokens(2, 64), session="B", max_tokens=8), list(script))  # 5 blocks
    d.run_until_finished(a, b)
    assert s.continuum.pins.get("A") and s.continuum.pins.get("B")
    hog = d.add(make_request(tokens(3, 64), max_tokens=400))  # runs through the test
    d.step()
    parked = d.add(make_request(tokens(4, 16), max_tokens=2))
    parked.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR  # never compiles here
    d.advance(0.01)
    young = d.add(make_request(tokens(5, 96), max_tokens=2), [FILLER_TOKEN, EOS_TOKEN_ID])
    history = list(a.prompt_token_ids) + list(a.output_token_ids)
    d.add(make_request(history + tokens(6, 120), session="A", max_tokens=2))  # cannot fit
    for step in range(40):
        d.step()
        d.advance(0.1)
        if young.status != RequestStatus.WAITING:
            break
    assert young.status != RequestStatus.WAITING, "the parked request kept the overdue one waiting"
    assert step * 0.1 <= 0.5 + 1.0, step
    assert not hog.is_finished()
