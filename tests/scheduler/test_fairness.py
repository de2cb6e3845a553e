"""What everyone else pays (scheduler level, vLLM's real scheduler and block
pool, both vLLM builds): the waiting bound, stock order under
`ttl_policy: never` + `queue_order: fcfs`, priority first, honest
distinct-block accounting, pins that only their own context can use, and no
pins without prefix caching.

The synthetic engine's clock advances `STEP_S` per step, so seconds of the
waiting bound are steps here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from vllm.v1.request import RequestStatus
from vllm_continuum.core.waiting_queue import PINNED, REGULAR

from tests.scheduler.harness import (
    BLOCK_SIZE,
    EOS_TOKEN_ID,
    FILLER_TOKEN,
    Driver,
    FakeClock,
    admitted_hit,
    answer_script,
    assert_all_free,
    audit,
    drain,
    first_turn,
    make_request,
    make_scheduler,
    next_turn,
    tokens,
    tool_call_script,
)

STEP_S = 0.1


# ----------------------------------------------------------------- a fleet
@dataclass
class Fleet:
    """Agent sessions cycling (a turn of ~20 decode steps ending in a tool
    call, a 3-step pause, the next turn continuing the context) and one-shot
    requests without a session, on a scheduler stepped with a clock."""

    driver: Driver
    clock: FakeClock
    tool_token: int
    step_no: int = 0
    admitted: dict[str, int] = field(default_factory=dict)  # request id -> first admission step
    added: dict[str, int] = field(default_factory=dict)  # request id -> step it was added
    turns: int = 0
    live: dict[str, object] = field(default_factory=dict)  # session -> its running turn
    paused: dict[str, int] = field(default_factory=dict)  # session -> steps until its next turn
    history: dict[str, list[int]] = field(default_factory=dict)

    def add(self, request, script=None):
        self.added[request.request_id] = self.step_no
        self.driver.add(request, script)
        return request

    def agent_turn(self, session: str, prompt: list[int]):
        # Sessions decode 17-23 tokens a turn, so their turns drift apart.
        decode = 17 + 2 * int(session.rsplit("-", 1)[1]) % 7
        script = [FILLER_TOKEN] * decode + [self.tool_token, FILLER_TOKEN, EOS_TOKEN_ID]
        return self.add(make_request(prompt, session=session, max_tokens=32), script)

    def start(self, sessions: int, first_prompt: int) -> None:
        """Session i starts at step 4 i; its turns then cycle as the fleet runs."""
        for i in range(sessions):
            self.paused[f"agent-{i}"] = 1 + 4 * i
            self.history[f"agent-{i}"] = tokens(i, first_prompt - 16)

    def run(self, steps: int, until=None) -> None:
        live, paused = self.live, self.paused
        for _ in range(steps):
            if until is not None and until():
                return
            out = self.driver.step()
            self.step_no += 1
            self.clock.advance(STEP_S)
            for new in out.scheduled_new_reqs:
                self.admitted.setdefault(new.req_id, self.step_no)
            for session, request in list(live.items()):
                if request.is_finished():
                    del live[session]
                    paused[session] = 3
                    self.turns += 1
                    self.history[session] = list(request.all_token_ids)
            for session in list(paused):
                paused[session] -= 1
                if paused[session] <= 0:
                    del paused[session]
                    prompt = self.history[session] + tokens(self.turns, 16)
                    live[session] = self.agent_turn(session, prompt)

    def wait_steps(self, request) -> int:
        return self.admitted[request.request_id] - self.added[request.request_id]


def fleet(model_dir, flavour: str, num_blocks=64, policy="fcfs", **settings) -> Fleet:
    """flavour: stock, or a continuum pressure/TTL variant; `settings` (ContinuumConfig
    fields) over the flavour's."""
    paper = {"queue_order": "program_fcfs"}  # the order that puts newcomers last
    flavour_settings = {
        "stock": {},
        "default": {},  # what ships
        "hold": {"ttl_policy": "fixed", "pressure_policy": "hold", **paper},
        "yield": {"ttl_policy": "fixed", "pressure_policy": "yield", **paper},
        "never": {"ttl_policy": "never", **paper},
        "never-fcfs": {"ttl_policy": "never", "queue_order": "fcfs"},
    }[flavour]
    s = make_scheduler(model_dir, num_blocks=num_blocks, continuum=flavour != "stock",
                       max_num_seqs=16, max_num_batched_tokens=1024, policy=policy,
                       settings={**flavour_settings, **settings})
    clock = FakeClock()
    if flavour != "stock":
        s.continuum.clock = clock
    driver = Driver(s)
    stock_step = driver.step

    def audited_step():
        out = stock_step()
        if flavour != "stock":
            audit(s)
        return out

    driver.step = audited_step
    tool_token = s.structured_output_manager.tokenizer.get_vocab()["<tool_call>"]
    return Fleet(driver, clock, tool_token)


def starvation(model_dir, flavour: str, **settings) -> tuple[int | None, Fleet]:
    """The issue's scenario: a 63-block pool, 4 agent sessions cycling, and at
    step 30 a 576-token request without a session. Returns its wait in steps
    (None: never admitted in 600 steps)."""
    f = fleet(model_dir, flavour, **settings)
    f.start(sessions=4, first_prompt=160)
    f.run(30)
    big = f.add(make_request(tokens(99, 576), max_tokens=4))
    f.run(570, until=lambda: big.request_id in f.admitted)
    return (f.wait_steps(big) if big.request_id in f.admitted else None), f


# ------------------------------------------------------------ waiting bound
BOUND_S = 2.0


def test_a_newcomer_is_admitted_within_the_bound_under_every_policy(tiny_model_dir, capsys):
    """Stock vLLM admits the newcomer within a few steps; on today's main
    continuum never did (hold, yield, and even never). With the waiting bound,
    after BOUND_S it goes first and pins give way to it: it then waits only
    for the agent turns already running to end (about 20 decode steps)."""
    waits = {}
    for flavour in ("stock", "default", "hold", "yield", "never", "never-fcfs"):
        waits[flavour], _ = starvation(tiny_model_dir, flavour, max_queue_delay_s=BOUND_S)
    # today's main, in effect: no bound
    waits["hold, no bound"], _ = starvation(tiny_model_dir, "hold", max_queue_delay_s=float("inf"))
    with capsys.disabled():
        print("\nsteps a 576-token newcomer waits behind 4 cycling agents:", waits)
    assert waits["stock"] is not None
    running_turn_steps = 22  # a turn already running when the bound passes still ends
    bound_steps = math.ceil(BOUND_S / STEP_S)
    for flavour in ("default", "hold", "yield", "never"):
        assert waits[flavour] is not None, f"{flavour}: newcomer starved"
        assert waits[flavour] <= bound_steps + running_turn_steps, (flavour, waits)
    assert waits["never-fcfs"] == waits["stock"]
    assert waits["hold, no bound"] is None  # the failure the bound fixes


def mixed_fleet(model_dir, flavour, policy="fcfs"):
    """Agents, one-shot requests at random steps (some with priorities), and
    a request that cannot fit until the agents drain: every request's
    admission step, in the order they were added."""
    import random

    f = fleet(model_dir, flavour, num_blocks=48, policy=policy, max_queue_delay_s=BOUND_S)
    rng = random.Random(7)
    f.start(sessions=5, first_prompt=120)
    for step in range(300):
        if rng.random() < 0.15:
            size = rng.choice([40, 90, 300])
            r = make_request(tokens(1000 + step, size), max_tokens=rng.randint(2, 12),
                             priority=rng.randint(0, 2) if policy == "priority" else 0)
            f.add(r)
        f.run(1)
    return [f.admitted.get(rid) for rid in f.added]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_never_with_fcfs_is_stock_vllm_exactly(tiny_model_dir, policy):
    """The A/B baseline: `ttl_policy: never` + `queue_order: fcfs` admits
    every request at the same step as stock vLLM (with priorities too)."""
    runs = {}
    for flavour in ("stock", "never-fcfs"):
        runs[flavour] = mixed_fleet(tiny_model_dir, flavour, policy)
    assert sum(step is not None for step in runs["stock"]) > 40
    assert runs["never-fcfs"] == runs["stock"]


# ------------------------------------------------------------------ priority
def test_priority_comes_before_the_lanes(build):
    """With --scheduling-policy priority a pin cannot buy a place in line: a
    pinned context's next turn of lower priority waits behind better work."""
    d = build(policy="priority", max_num_seqs=1)
    s = d.scheduler
    t1 = first_turn(d, "A", priority=1)
    busy = d.add(make_request(tokens(3000, 32), max_tokens=6))
    d.step()
    t2 = d.add(next_turn(t1, priority=1), answer_script())  # pinned lane, priority 1
    urgent = d.add(make_request(tokens(4000, 32), max_tokens=2, priority=0))
    assert [r.request_id for r in s.waiting][:2] == [urgent.request_id, t2.request_id]
    order = []
    for _ in range(40):
        out = d.step()
        order += [n.req_id for n in out.scheduled_new_reqs]
    assert order.index(urgent.request_id) < order.index(t2.request_id)
    assert busy.is_finished()


# ----------------------------------------------------------------- accounting
def test_caps_count_a_shared_system_prompt_once(build):
    """Two sessions share an 18-block system prompt: their pins hold 22
    distinct blocks, which fit a cap of 31 (on today's main the second pin was
    refused: 20 + 20 > 31)."""
    d = build(num_blocks=64, settings={"max_pinned_fraction": 31.5 / 63})
    s = d.scheduler
    system = tokens(42, 18 * BLOCK_SIZE)
    for session, seed in (("A", 1), ("B", 2)):
        request = make_request(system + tokens(seed, 20), session=session, max_tokens=32)
        d.add(request, tool_call_script(d))
        d.run_until_finished(request)
    assert {p.session_id for p in s.continuum.pins} == {"A", "B"}
    assert s.continuum.pins.num_pinned_blocks == 22
    assert sum(s.continuum.pins.share(p) for p in s.continuum.pins) == pytest.approx(22)
    assert s.continuum.stats.pins_refused_by_cap == 0
    assert_all_free(d)


def test_the_cap_releases_nothing_unless_the_new_pin_is_then_made(build):
    """A, then B, then C arrive; A and C pin; B's pin would fit only if more
    than C's pin went: C's pin is kept and B's is refused."""
    d = build(num_blocks=64, settings={"max_pinned_fraction": 15.5 / 63})  # cap 15
    s = d.scheduler
    a = make_request(tokens(0, 120), session="A", max_tokens=32)  # 8 blocks
    b = make_request(tokens(1000, 150), session="B", max_tokens=32)  # 10
    c = make_request(tokens(2000, 50), session="C", max_tokens=32)  # 4
    d.add(a, tool_call_script(d))
    d.advance(1.0)
    d.add(b, [FILLER_TOKEN] * 4 + tool_call_script(d))
    d.advance(1.0)
    d.add(c, tool_call_script(d))
    d.run_until_finished(a, b, c)
    assert {p.session_id for p in s.continuum.pins} == {"A", "C"}
    assert s.continuum.stats.releases_by_reason == {}
    assert s.continuum.stats.pins_refused_by_cap == 1
    assert_all_free(d)


# ------------------------------------------------- pins belong to their prefix
def test_a_request_that_only_carries_the_session_id_leaves_the_pin_alone(build):
    """Session ids are unauthenticated. A request with the same id but another
    prefix: is queued by its own arrival in the regular lane, does not take
    the pin over when admitted nor release it when aborted or marked last,
    ends no program and records no tool duration."""
    d = build()
    s = d.scheduler
    t1 = first_turn(d, "A", name="search")
    pin = s.continuum.pins.get("A")
    durations = s.continuum.workload.tools.num_samples

    d.advance(1.0)
    stranger = make_request(tokens(777, 80), session="A", max_tokens=4)
    d.add(stranger, answer_script())
    assert s.continuum.queue.lane_of(stranger) == REGULAR
    own = s.continuum.turns[stranger.request_id].arrival
    assert s.continuum.queue.place(stranger) == own > pin.program_arrival  # not the program's
    admitted_hit(d, stranger)
    drain(d)
    assert s.continuum.pins.holds(pin)

    for xargs in (None, {"continuum_last_turn": 1}):
        other = make_request(tokens(888, 80), session="A", max_tokens=4, xargs=xargs)
        d.add(other)
        if xargs is None:
            s.finish_requests(other.request_id, RequestStatus.FINISHED_ABORTED)
        else:
            d.run_until_finished(other)
        assert s.continuum.pins.holds(pin)
    assert s.continuum.workload.tools.num_samples == durations
    assert pin.program in s.continuum.programs and pin.program.turns == 1  # A's program lives on
    assert len(s.continuum.workload.programs) == 1  # the stranger's last turn ended its own
    assert s.continuum.stats.releases_by_reason == {}

    # The session's real next turn still takes its pin over and is measured.
    t2 = d.add(next_turn(t1), answer_script())
    assert s.continuum.queue.lane_of(t2) == PINNED
    admitted_hit(d, t2)
    assert not s.continuum.pins.holds(pin)
    assert s.continuum.stats.releases_by_reason == {"resumed": 1}
    assert s.continuum.workload.tools.num_samples == durations + 1
    drain(d)
    assert_all_free(d)


def test_a_flood_of_session_ids_cannot_make_a_stranger_the_session(build):
    """The session table is bounded: a flood of fresh ids (each request aborted
    at once, so it costs its sender nothing) used to push session A out of it,
    after which a guessed id with `continuum_last_turn` counted as A's first
    turn and released A's pins. Now the flood cannot evict a session that
    finished a turn, and a pin answers only to a request continuing it."""
    d = build(settings={"max_tracked_sessions": 8})
    s = d.scheduler
    t1 = first_turn(d, "A", name="search")
    pin = s.continuum.pins.get("A")
    for i in range(200):
        flood = d.add(make_request(tokens(10_000 + i, 20), session=f"flood-{i}", max_tokens=4))
        s.finish_requests(flood.request_id, RequestStatus.FINISHED_ABORTED)
    assert len(s.continuum.programs) <= 8
    for program in s.continuum.programs.of_session("A"):  # and were A forgotten anyway: the pin decides
        s.continuum.programs.end(program)
    guess = make_request(tokens(888, 80), session="A", max_tokens=4,
                         xargs={"continuum_last_turn": 1})
    d.add(guess, answer_script())
    d.run_until_finished(guess)
    assert s.continuum.pins.holds(pin) and pin.program.turns == 1
    t2 = d.add(next_turn(t1), answer_script())
    assert s.continuum.queue.place(t2) == pin.program_arrival  # the program's place
    assert admitted_hit(d, t2) >= (t1.num_prompt_tokens // BLOCK_SIZE - 1) * BLOCK_SIZE
    assert s.continuum.stats.releases_by_reason == {"resumed": 1}
    drain(d)
    assert_all_free(d)


# ------------------------------------------------------- no prefix caching
def test_without_prefix_caching_nothing_is_pinned(tiny_model_dir, caplog):
    stock = make_scheduler(tiny_model_dir, continuum=False, enable_prefix_caching=False)
    s = make_scheduler(tiny_model_dir, enable_prefix_caching=False, settings={"ttl_policy": "fixed"})
    assert any("prefix caching is off" in r.getMessage() for r in caplog.records)
    s.continuum.clock = FakeClock()
    steps = {}
    for name, scheduler in (("stock", stock), ("continuum", s)):
        d = Driver(scheduler)
        t1 = first_turn(d, "A")
        t2 = d.add(next_turn(t1), answer_script())
        steps[name] = admitted_hit(d, t2)
    assert len(s.continuum.pins) == 0 and sum(s.continuum.stats.pins_by_tool.values()) == 0
    assert steps["continuum"] == steps["stock"] == 0


# ------------------------------------------------------------------- pressure
def test_yield_computes_the_shortfall_once_and_churns_nothing(build):
    """The queue head cannot fit even with every pin released: one allocation
    attempt per step, no pin released and touched back (today's main released
    every pin and retried once per pin, every step)."""
    d = build(num_blocks=41, settings={"pressure_policy": "yield"})
    s = d.scheduler
    first_turn(d, "A", prompt_len=60)  # 4 blocks pinned
    first_turn(d, "B", prompt_len=40, start=1)  # 3 more
    hog = d.add(make_request(tokens(2000, 480), max_tokens=200))  # 31+ blocks, runs long
    d.step()
    waiter = d.add(make_request(tokens(6000, 200), max_tokens=2))  # 13 blocks: cannot fit
    calls, released = [], []
    stock_allocate = s._stock_allocate_slots
    s._stock_allocate_slots = lambda r, *a, **k: calls.append(r.request_id) or stock_allocate(r, *a, **k)
    stock_give_back = s._ledger.give_back
    s._ledger.give_back = lambda blocks, fence: released.append(blocks) or stock_give_back(blocks, fence)
    for _ in range(3):
        d.step()
        assert calls.count(waiter.request_id) == 1 and not released
        calls.clear()
    assert waiter.status == RequestStatus.WAITING and len(s.continuum.pins) == 2 and not hog.is_finished()


def test_yield_releases_only_the_pins_that_cover_the_shortfall(build):
    d = build(num_blocks=41, settings={"pressure_policy": "yield", "max_pinned_fraction": 1})
    s = d.scheduler
    for i, session in enumerate("ABC"):  # 7 blocks each; C arrived last
        d.advance(0.01)
        first_turn(d, session, prompt_len=100, start=i)
    hog = d.add(make_request(tokens(2000, 200), max_tokens=200))  # 13+ blocks
    d.step()
    assert s._ledger.num_free() < 9
    waiter = d.add(make_request(tokens(6000, 130), max_tokens=2))  # 9 blocks: C's pin covers it
    admitted_hit(d, waiter)
    assert {p.session_id for p in s.continuum.pins} == {"A", "B"}
    assert s.continuum.stats.releases_by_reason == {"pressure": 1}
    assert not hog.is_finished()


def test_hold_lets_a_preempted_request_use_pinned_memory(build):
    """hold keeps pins while other work runs, but not from a request that was
    preempted: it has lost its KV once already."""
    # program_fcfs: the agent is admitted first
    d = build(num_blocks=24, max_num_seqs=3, settings={"queue_order": "program_fcfs"})
    s = d.scheduler
    # The agent's turn ends (and pins) while q, preempted as p and q grow, waits.
    agent = d.add(make_request(tokens(3, 20), session="A", max_tokens=100),
                  [FILLER_TOKEN] * 80 + tool_call_script(d))
    p = d.add(make_request(tokens(1, 100), max_tokens=120))
    q = d.add(make_request(tokens(2, 100), max_tokens=120))
    for _ in range(120):
        d.step()
        if s.continuum.pins and q.status == RequestStatus.PREEMPTED:
            break
    else:
        pytest.fail("scenario did not produce a pin beside a preempted request")
    assert s.running, "the point: hold would keep the pin while something runs"
    d.step()
    assert q.status == RequestStatus.RUNNING and not s.continuum.pins
    assert s.continuum.stats.releases_by_reason == {"pressure": 1}
    drain(d)
    assert p.is_finished() and agent.is_finished()


# ------------------------------------------------------------- model inputs
def test_the_ttl_is_decided_on_the_tokens_the_pin_keeps(build):
    """The session quota keeps only a long context's first blocks: the TTL
    model is asked about those, not the whole context."""
    from vllm_continuum.core.ttl import FixedTTLPolicy

    d = build(num_blocks=64, settings={"max_session_pinned_fraction": 0.25})  # 15 of 63 blocks
    s = d.scheduler
    asked = []

    class Recorder(FixedTTLPolicy):
        def choose(self, turn):
            asked.append(turn.num_context_tokens)
            return super().choose(turn)

    s.continuum.maker.ttl_policy = Recorder(2.0, {}, 30.0)
    t1 = first_turn(d, "A", prompt_len=400)  # 26 blocks
    assert s.continuum.pins.get("A").num_blocks == 15
    assert asked == [15 * BLOCK_SIZE] and t1.num_tokens > 15 * BLOCK_SIZE
