"""Every pin rule of `PinController`, on hand-worked cases, without vLLM.

The ledger is a dictionary of reference counts (block ids are the blocks),
requests are plain records, the clock is a number: what vLLM would do
around the controller is spelled out in each test.
"""

from __future__ import annotations

import math

from collections import Counter
from dataclasses import dataclass, field

import pytest

from vllm_continuum.config import load_config
from vllm_continuum.core.controller import PinController
from vllm_continuum.core.tool_calls import ToolCall
from vllm_continuum.core.waiting_queue import PINNED, REGULAR
from vllm_continuum.metrics.stats import ContinuumStats

BLOCK = 4  # tokens per block


class Ledger:
    """Reference counts per block id; a finished request's blocks are its `blocks`."""

    def __init__(self, pool_size: int) -> None:
        self.pool_size = pool_size
        self.refs: Counter[int] = Counter()

    def take(self, request):
        return list(request.blocks), 0

    def give_back(self, blocks, fence) -> None:
        for block in blocks:
            self.refs[block] -= 1
            if self.refs[block] <= 0:
                del self.refs[block]

    def take_back(self, blocks) -> None:
        self.refs.update(blocks)

    def can_give_back_now(self, fence) -> bool:
        return True

    def ids(self, blocks, keep_null=False):
        return tuple(blocks)

    def ref_count(self, block_id) -> int:
        return self.refs[block_id]


@dataclass
class Req:
    request_id: str
    session_id: str | None
    blocks: list[int]  # its physical blocks, one hash per block
    num_output_tokens: int = 3
    # vLLM's wall-clock stamp, far from the controller's clock: never read.
    arrival_time: float = 1.8e9
    priority: int = 0
    block_hashes: list = field(default_factory=list)
    status: str = "waiting"
    cache_salt: str | None = None  # its tenant (core/tool_stats.py)

    def __post_init__(self) -> None:
        if not self.block_hashes:  # hashes chain: the prefix is the identity
            self.block_hashes = [tuple(self.blocks[: i + 1]) for i in range(len(self.blocks))]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.blocks) * BLOCK

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def controller(pool_size=100, **settings) -> tuple[PinController, Ledger, Clock]:
    settings = {"ttl_policy": "fixed", "default_ttl_s": 2.0, "max_session_pinned_fraction": 1.0,
                **settings}
    ledger, clock = Ledger(pool_size), Clock()
    c = PinController(
        load_config(use_env=False, **settings), ledger, ContinuumStats(writer=None),
        block_size=BLOCK, hash_block_size=BLOCK, clock=clock,
    )
    return c, ledger, clock


def run(c: PinController, ledger: Ledger, req: Req, tool: str | None = "search") -> bool:
    """A request arrives, holds its blocks while it runs, finishes; True if pinned."""
    c.on_arrival(req, None)
    ledger.take_back(req.blocks)
    pinned = c.on_finished(req, aborted=False, tool_called=lambda _: tool and ToolCall(tool, "hermes"))
    if not pinned:
        ledger.give_back(req.blocks, 0)
    return pinned


def test_a_tool_call_turn_is_pinned_for_its_ttl_and_a_plain_answer_is_not():
    c, ledger, clock = controller()
    assert run(c, ledger, Req("a1", "A", [1, 2, 3]))
    assert not run(c, ledger, Req("b1", "B", [7, 8]), tool=None)
    assert not run(c, ledger, Req("x", None, [9]))  # no session: nothing to resume
    pin = c.pins.get("A")
    assert (pin.block_ids, pin.expires_at) == ((1, 2, 3), 2.0)
    assert dict(ledger.refs) == {1: 1, 2: 1, 3: 1}


def test_the_next_turn_gets_the_pinned_lane_and_takes_the_pin_over_on_admission():
    c, ledger, clock = controller()
    run(c, ledger, Req("a1", "A", [1, 2, 3]))
    clock.now = 1.0
    nxt = Req("a2", "A", [1, 2, 3, 4])
    stranger = Req("s1", "A", [5, 6])  # same id, another prefix
    c.on_arrival(nxt, None)
    c.on_arrival(stranger, None)
    assert (c.queue.lane_of(nxt), c.queue.lane_of(stranger)) == (PINNED, REGULAR)
    assert c.queue.place(nxt) == 0.0  # the program's first arrival
    assert c.queue.place(stranger) == 1.0  # its own: it inherits nothing
    ledger.take_back([1, 2, 3, 4])  # vLLM allocates the turn, hitting the pinned blocks
    c.after_step([(nxt, 12)])
    assert not c.pins and c.stats.releases_by_reason == {"resumed": 1}
    assert ledger.refs[1] == 1  # the turn's own reference: nothing became evictable


def test_a_stranger_with_the_session_id_neither_ends_nor_releases_the_program():
    c, ledger, _ = controller()
    run(c, ledger, Req("a1", "A", [1, 2, 3]))
    c.on_arrival(Req("s1", "A", [5, 6]), {"continuum_last_turn": True})
    c.on_finished(Req("s1", "A", [5, 6]), aborted=True, tool_called=lambda _: None)
    pin = c.pins.get("A")
    assert pin is not None and pin.program in c.programs  # A's program lives on
    assert len(c.workload.programs) == 1  # the stranger ended its own one-turn program


@pytest.mark.parametrize("forgotten_by", ["flood", "idle horizon", "any loss"])
def test_only_a_request_continuing_a_pin_ends_or_releases_it(forgotten_by):
    """Whatever the session table says (it is bounded, and forgets idle
    programs), a guessed id cannot release a live pin, and the program's own
    next turn is recognised by the pin it continues: its place in the queue,
    its tool duration and the hand-over survive."""
    c, ledger, clock = controller(max_tracked_sessions=4, program_idle_horizon_s=1.0,
                                  default_ttl_s=30.0)
    clock.now = 1.0
    assert run(c, ledger, Req("a1", "A", [1, 2, 3]))
    clock.now = 3.0
    if forgotten_by == "flood":  # fresh ids, each aborted before any output
        for i in range(100):
            flood = Req(f"f{i}", f"flood-{i}", [1000 + i], num_output_tokens=0)
            c.on_arrival(flood, None)
            c.on_finished(flood, aborted=True, tool_called=lambda _: None)
    elif forgotten_by == "idle horizon":  # shorter than the pin's TTL
        c.on_arrival(Req("b1", "B", [50]), None)  # any arrival runs the idle check
    else:
        for program in c.programs.of_session("A"):
            c.programs.end(program)
    stranger = Req("s1", "A", [5, 6])
    c.on_arrival(stranger, {"continuum_last_turn": True})
    assert c.queue.lane_of(stranger) == REGULAR and c.queue.place(stranger) == 3.0
    c.on_finished(stranger, aborted=False, tool_called=lambda _: None)
    pin = c.pins.get("A")
    assert pin is not None and len(c.workload.programs) == 1, "a stranger released the pin"
    assert pin.program.turns == 1, "a stranger ended A's program"  # (the one ended was its own)
    clock.now = 4.0
    nxt = Req("a2", "A", [1, 2, 3, 4])
    c.on_arrival(nxt, None)
    assert c.queue.lane_of(nxt) == PINNED and c.queue.place(nxt) == 1.0  # the program's place
    assert c.workload.tools.of(None).durations.of("search").sorted == [3.0]  # turn end 1 s, arrival 4 s
    c.after_step([(nxt, 12)])
    assert c.stats.releases_by_reason == {"resumed": 1}


def test_a_last_turn_releases_the_pins_it_continues():
    c, ledger, _ = controller()
    run(c, ledger, Req("a1", "A", [1, 2, 3]))
    last = Req("a2", "A", [1, 2, 3, 4])
    c.on_arrival(last, {"continuum_last_turn": True})
    ledger.take_back(last.blocks)
    assert not c.on_finished(last, aborted=False, tool_called=lambda _: None)
    assert not c.pins and c.stats.releases_by_reason == {"last_turn": 1}
    assert len(c.workload.programs) == 1  # the program ended, with its two turns


def test_the_session_quota_keeps_the_first_blocks():
    c, ledger, _ = controller(pool_size=10, max_session_pinned_fraction=0.3)
    assert run(c, ledger, Req("a1", "A", [1, 2, 3, 4, 5]))
    assert c.pins.get("A").block_ids == (1, 2, 3)  # 30% of 10: the prefix the next turn hits
    assert dict(ledger.refs) == {1: 1, 2: 1, 3: 1}


def test_the_cap_releases_later_programs_only_if_the_new_pin_then_fits():
    c, ledger, clock = controller(pool_size=10, max_pinned_fraction=0.5)
    clock.now = 1.0
    a1 = Req("a1", "A", [5, 6, 7])
    c.on_arrival(a1, None)  # A arrives first, and finishes last
    clock.now = 5.0
    run(c, ledger, Req("b1", "B", [1, 2]))  # a later program
    clock.now = 6.0
    run(c, ledger, Req("c1", "C", [3, 4]))
    # A arrived first: its 3-block pin fits under 5 once one later pin goes.
    ledger.take_back(a1.blocks)
    assert c.on_finished(a1, aborted=False, tool_called=lambda _: ToolCall("search", "hermes"))
    assert {p.session_id for p in c.pins} == {"A", "B"}  # C, the latest, went
    assert c.stats.releases_by_reason == {"pressure": 1}
    # D arrived last: nothing may go for it, so it is refused and nothing is released.
    clock.now = 9.0
    assert not run(c, ledger, Req("d1", "D", [8, 9]))
    assert {p.session_id for p in c.pins} == {"A", "B"}
    assert c.stats.pins_refused_by_cap == 1


def test_shared_blocks_count_once_under_the_cap():
    c, ledger, _ = controller(pool_size=10, max_pinned_fraction=0.5)
    system = [1, 2, 3]  # a shared system prompt
    assert run(c, ledger, Req("a1", "A", system + [4]))
    # 4 + 4 blocks counted per pin would exceed the cap of 5; 5 distinct ones do not.
    assert run(c, ledger, Req("b1", "B", system + [5]))
    assert c.pins.num_pinned_blocks == 5
    assert dict(ledger.refs) == {1: 2, 2: 2, 3: 2, 4: 1, 5: 1}


def test_expiry_is_a_hard_bound_with_one_step_of_grace_for_a_queued_next_turn():
    c, ledger, clock = controller()
    run(c, ledger, Req("a1", "A", [1, 2, 3]))
    run(c, ledger, Req("b1", "B", [4, 5, 6]))
    c.on_arrival(Req("a2", "A", [1, 2, 3, 7]), None)  # queued
    clock.now = 2.5
    c.begin_step()  # A's next turn is queued: one step of grace; B has none
    assert [p.session_id for p in c.pins] == ["A"]
    c.begin_step()  # the grace is over
    assert not c.pins
    assert c.stats.releases_by_reason == {"expired": 2}


@pytest.mark.parametrize("policy, running, released", [
    ("yield", False, True), ("hold", False, False), ("hold", True, True),
])
def test_an_allocation_releases_the_fewest_pins_covering_its_shortfall(policy, running, released):
    c, ledger, clock = controller(pressure_policy=policy)
    run(c, ledger, Req("a1", "A", [1, 2, 3]))
    clock.now = 1.0
    run(c, ledger, Req("b1", "B", [4, 5]))
    clock.now = 2.0
    newcomer = Req("n", None, [8, 9])
    c.on_arrival(newcomer, None)
    result = c.releaser.retry_with_pins_released(
        newcomer, lambda: "blocks", shortfall=2, keep=frozenset(), running=running,
        preempted=False, waiting=not running, anything_running=True,
    )
    assert (result == "blocks") is released
    # B arrived later and covers 2 blocks alone: only it goes.
    assert {p.session_id for p in c.pins} == ({"A"} if released else {"A", "B"})


@pytest.mark.parametrize("admission", ["program", "request"])
def test_under_program_admission_only_one_shots_have_the_waiting_bound(admission):
    """A one-shot and a new program's first turn wait, passed by a later
    arrival, for longer than the bound. Program admission: the one-shot is
    overdue and pins give way to it; the program's turn is never overdue and
    waits for room (the pins hold). Request admission: both are overdue."""
    c, ledger, clock = controller(pressure_policy="hold", admission=admission,
                                  max_queue_delay_s=1.0)
    run(c, ledger, Req("a1", "A", [1, 2, 3]))
    clock.now = 1.0
    one_shot, program = Req("o", None, [8]), Req("c1", "C", [9])
    for r in (one_shot, program):
        c.on_arrival(r, None)
    clock.now = 2.0
    later = Req("l", None, [20])
    c.on_arrival(later, None)
    c.after_step([(later, 0)], lambda bound, level: 1.0)  # a later arrival went ahead of both
    clock.now = 4.0
    assert c.queue.overdue(one_shot)
    assert c.queue.overdue(program) is (admission == "request")

    def allocate(req):
        return c.releaser.retry_with_pins_released(
            req, lambda: "blocks", shortfall=2, keep=frozenset(), running=False,
            preempted=False, waiting=True, anything_running=True)

    assert (allocate(program) == "blocks") is (admission == "request")
    assert allocate(one_shot) == "blocks" or admission == "request"
    assert not c.pins


def test_an_endless_program_loses_its_precedence():
    c, ledger, clock = controller(pressure_policy="hold", program_precedence_s=100.0)
    run(c, ledger, Req("a1", "A", [1, 2, 3]))
    clock.now = 150.0  # A has been at it longer than its precedence
    new = Req("n1", "N", [8, 9])
    c.on_arrival(new, None)
    clock.now = 150.5
    turn = Req("a2", "A", [1, 2, 3, 4])
    c.on_arrival(turn, None)
    assert c.queue.place(turn) == 150.5 > c.queue.place(new)  # behind the newcomer
    assert c.releaser.retry_with_pins_released(
        new, lambda: "blocks", shortfall=3, keep=frozenset(), running=False,
        preempted=False, waiting=True, anything_running=True) == "blocks"


def test_a_retry_that_still_fails_restores_every_pin():
    c, ledger, _ = controller(pressure_policy="yield")
    run(c, ledger, Req("a1", "A", [1, 2, 3]))
    before = dict(ledger.refs)
    result = c.releaser.retry_with_pins_released(
        Req("n", None, [8]), lambda: None, shortfall=1, keep=frozenset(), running=False,
        preempted=False, waiting=True, anything_running=False,
    )
    assert result is None and c.pins.get("A") is not None and dict(ledger.refs) == before
    assert not c.stats.releases_by_reason


def test_pins_that_cannot_cover_the_shortfall_are_not_released_for_nothing():
    c, ledger, _ = controller(pressure_policy="yield")
    run(c, ledger, Req("a1", "A", [1, 2]))
    assert c.releaser.retry_with_pins_released(
        Req("n", None, [8]), lambda: "blocks", shortfall=3, keep=frozenset(), running=True,
        preempted=False, waiting=False, anything_running=True,
    ) is None
    assert c.pins.get("A") is not None


def test_the_measured_tool_duration_feeds_the_model_only_from_the_program_itself():
    c, ledger, clock = controller()
    run(c, ledger, Req("a1", "A", [1, 2, 3]))
    clock.now = 1.25
    c.on_arrival(Req("s1", "A", [5, 6]), None)  # a stranger: no duration
    c.on_arrival(Req("a2", "A", [1, 2, 3, 4]), None)
    assert c.workload.tools.of(None).durations.of("search").sorted == [pytest.approx(1.25)]


def test_without_prefix_caching_nothing_is_pinned():
    c, ledger, _ = controller()
    c.pinning = False
    assert not run(c, ledger, Req("a1", "A", [1, 2, 3]))
    assert not ledger.refs


def test_core_imports_no_vllm_and_no_io_library():
    """core/ is the pure part: importing every module of it pulls in none of these."""
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, sys, vllm_continuum.core as core\n"
        "for m in pkgutil.iter_modules(core.__path__):\n"
        "    importlib.import_module(f'vllm_continuum.core.{m.name}')\n"
        "banned = ('vllm', 'torch', 'httpx', 'openai', 'prometheus_client', 'fastapi')\n"
        "print(sorted({n.split('.')[0] for n in sys.modules} & set(banned)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# No queue here: the bounds keep every mark (nothing is pruned).
KEEP_MARKS = lambda bound, level: -math.inf  # noqa: E731  (everyone still waits)


def test_a_turn_ages_against_one_shots_that_arrived_after_it_only():
    """Under sessionless_first one-shots go before session turns. A turn ages
    from the first admission of a one-shot that arrived after it; one-shots
    start no turn bound (they are not programs ahead of it in any order)."""
    c, ledger, clock = controller(pressure_policy="hold", max_turn_aging_s=5.0)
    early = Req("o0", None, [7])
    c.on_arrival(early, None)
    clock.now = 1.0
    turn = Req("a1", "A", [1, 2])
    c.on_arrival(turn, None)
    c.after_step([(early, 0)], KEEP_MARKS)  # arrived before the turn: stock's order, no aging
    clock.now = 10.0
    assert not c.queue.aged(turn)
    late = Req("o1", None, [8])
    c.on_arrival(late, None)
    c.after_step([(late, 0)], KEEP_MARKS)  # arrived after it: it ages from now
    clock.now = 14.9
    assert not c.queue.aged(turn)
    clock.now = 15.0
    assert c.queue.aged(turn) and not c.queue.turn_overdue(turn)


@pytest.mark.parametrize("lane", ["pinned", "regular"])
def test_a_later_programs_turn_admitted_first_starts_the_turn_bound(lane):
    """Whatever lane it comes through, a later program's turn admitted while an
    earlier program's turn waits starts that turn's bound (issue 46: later
    programs cycling their pins kept an expired agent out forever)."""
    c, ledger, clock = controller(pressure_policy="hold", max_turn_delay_s=5.0)
    first = Req("a1", "A", [1, 2])
    c.on_arrival(first, None)  # program A, waiting
    clock.now = 1.0
    assert run(c, ledger, Req("b1", "B", [3, 4]))  # program B: a pin
    nxt = Req("b2", "B", [3, 4, 5]) if lane == "pinned" else Req("c1", "C", [9])
    c.on_arrival(nxt, None)
    assert c.queue.lane_of(nxt) == (PINNED if lane == "pinned" else REGULAR)
    ledger.take_back(nxt.blocks)
    clock.now = 2.0
    c.after_step([(nxt, 8)], KEEP_MARKS)
    clock.now = 6.9
    assert not c.queue.turn_overdue(first)
    clock.now = 7.0
    assert c.queue.turn_overdue(first)


def test_an_aged_turn_waiting_for_earlier_programs_pins_restarts_its_aging():
    """An aged first turn of a new program reaches the head but only the pins
    of an earlier program could make room: it waits for them as it would
    anyway, so its aging restarts and the one-shots behind it are not
    counted as held back by pins."""
    requeued = []
    c, ledger, clock = controller(pool_size=4, pressure_policy="hold", max_turn_aging_s=5.0,
                                  max_queue_delay_s=1.0)
    c.queue._requeue = requeued.append
    assert run(c, ledger, Req("a1", "A", [1, 2, 3]))  # A: 3 blocks pinned, 1 free
    clock.now = 1.0
    new = Req("n1", "N", [8, 9])
    c.on_arrival(new, None)
    clock.now = 2.0
    one_shot, behind = Req("o1", None, [10]), Req("o2", None, [11])
    c.on_arrival(one_shot, None)
    c.on_arrival(behind, None)
    c.after_step([(one_shot, 0)], KEEP_MARKS)  # N ages from t=2
    clock.now = 7.0
    assert c.queue.aged(new)
    assert c.releaser.retry_with_pins_released(
        new, lambda: "blocks", shortfall=1, keep=frozenset(), running=False,
        preempted=False, waiting=True, anything_running=True) is None
    assert requeued == [new] and not c.queue.aged(new)
    clock.now = 9.0
    assert not c.queue.overdue(behind)  # not held back by pins
    c.after_step([(behind, 0)], KEEP_MARKS)  # it arrived before the restart: no aging
    later = Req("o3", None, [12])
    c.on_arrival(later, None)
    c.after_step([(later, 0)], KEEP_MARKS)  # ages again from t=9
    clock.now = 13.9
    assert not c.queue.aged(new)
    clock.now = 14.0
    assert c.queue.aged(new)


# ------------------------------------------------------- program order by service
def test_service_levels_double_from_a_base():
    from vllm_continuum.core.program_order import SERVICE_BASE, SERVICE_LEVELS, service_level

    assert service_level(0) == 0  # served nothing yet: a new program's first turn
    assert service_level(1) == service_level(SERVICE_BASE - 1) == 1
    assert service_level(SERVICE_BASE) == service_level(2 * SERVICE_BASE - 1) == 2
    assert service_level(2 * SERVICE_BASE) == 3
    assert service_level(10**12) == SERVICE_LEVELS - 1


def test_a_program_is_served_what_it_prefilled_beyond_its_hit_and_decoded():
    c, ledger, clock = controller(program_order="service")
    first = Req("a1", "A", [1, 2, 3], num_output_tokens=5)
    c.on_arrival(first, None)
    ledger.take_back(first.blocks)
    c.after_step([(first, 0)])
    c.on_finished(first, aborted=False, tool_called=lambda _: ToolCall("t", "hint"))
    program = c.pins.get("A").program
    assert program.service == 3 * BLOCK + 5
    nxt = Req("a2", "A", [1, 2, 3, 4], num_output_tokens=2)
    c.on_arrival(nxt, None)
    ledger.take_back(nxt.blocks)
    c.after_step([(nxt, 3 * BLOCK)])  # its first 3 blocks were cached (the pin)
    c.on_finished(nxt, aborted=False, tool_called=lambda _: None)
    assert program.service == 3 * BLOCK + 5 + BLOCK + 2


@pytest.mark.parametrize("order", ["arrival", "service"])
def test_under_service_order_a_new_program_goes_before_a_served_one(order):
    """A's next turn (its pin expired) and B's first turn wait in the regular
    lane: by arrival A's program goes first; by service B's, which has been
    served nothing."""
    c, ledger, clock = controller(program_order=order, default_ttl_s=1.0)
    assert run(c, ledger, Req("a1", "A", [1, 2, 3]))
    clock.now = 5.0
    c.release_expired()  # A's pin expires
    a2 = Req("a2", "A", [1, 2, 3, 4])
    b1 = Req("b1", "B", [7, 8])
    c.on_arrival(a2, None)
    c.on_arrival(b1, None)
    assert c.queue.lane_of(a2) == c.queue.lane_of(b1) == REGULAR
    keys = {r.request_id: c.queue.queue_key(r) for r in (a2, b1)}
    first = min(keys, key=keys.get)
    assert first == ("a2" if order == "arrival" else "b1"), keys


class WholeHostTier:
    """A host tier that holds every context (vLLM's KV offload, scripted)."""

    def held_tokens(self, hashes, num_tokens: int) -> int:
        return num_tokens

    def reload_s(self, num_tokens: int) -> float:
        return num_tokens * 1e-6

    def loaded_tokens(self, request_id: str) -> int:
        return 0

    def keep(self, hashes) -> None:
        pass


def test_a_pin_handed_over_tells_what_the_host_tier_would_have_served():
    """A pin handed to its next turn is evidence of the host tier too: what it
    still held of the context (here all of it, the 8 blocks of a 9-block
    prompt), counted apart from lost pins' resumes (reloadable.py)."""
    from vllm_continuum.core.reloadable import MIN_SAMPLES

    settings = {"ttl_policy": "fixed", "default_ttl_s": 2.0, "max_session_pinned_fraction": 1.0}
    ledger = Ledger(1000)
    c = PinController(load_config(use_env=False, **settings), ledger, ContinuumStats(writer=None),
                      block_size=BLOCK, hash_block_size=BLOCK, clock=Clock(), host_tier=WholeHostTier())
    for i in range(MIN_SAMPLES):
        blocks = [100 * i + b for b in range(8)]
        assert run(c, ledger, Req(f"p{i}", f"S{i}", blocks))
        nxt = Req(f"p{i}-2", f"S{i}", blocks + [100 * i + 8])
        c.on_arrival(nxt, None)
        ledger.take_back(nxt.blocks)
        c.after_step([(nxt, len(blocks) * BLOCK)])  # handed over
    served = c.reloadable.served(None)
    assert c.stats.releases_by_reason == {"resumed": MIN_SAMPLES}
    assert served.trusted and served.kept.share == pytest.approx(8 / 9)
    assert not served.lost.judged  # no pin was lost
