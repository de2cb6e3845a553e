"""The core's cost per event does not grow with what the event does not
touch (docs/design.md, "What each event costs"). Counted in operations, not
timed: the scale benchmark (`vllm-continuum scale-bench`) times them."""

from __future__ import annotations

from collections import Counter

from tests.unit.test_controller import Ledger, Req, controller, run
from vllm_continuum.core.pin_table import Anchor
from vllm_continuum.core.programs import Program, ProgramTable
from vllm_continuum.core.tool_calls import ToolCall
from vllm_continuum.core.waiting_queue import LaneQueue


def counting(monkeypatch, cls, name: str, calls: Counter):
    original = getattr(cls, name)

    def counted(*args, **kwargs):
        calls[name] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(cls, name, counted)


def test_one_session_with_thousands_of_queued_turns_costs_linear(monkeypatch):
    """N tool-hinted requests of one session queued at once, then each
    finishes and pins: every pin event touches O(1) queued turns (it used to
    re-sort them all, each scanning the session's pins: O(N^3))."""
    n = 2000
    c, ledger, clock = controller(pool_size=10 * n, ttl_policy="fixed", default_ttl_s=30.0)
    queue = c.queue.lane_queue()
    c._on_lane_change = queue.requeue
    calls: Counter = Counter()
    counting(monkeypatch, Anchor, "continued_by", calls)
    counting(monkeypatch, LaneQueue, "_insert", calls)
    requests = [Req(f"r{i}", "S", [3 * i, 3 * i + 1, 3 * i + 2]) for i in range(n)]
    for r in requests:
        c.on_arrival(r, {"continuum_tool": "t"})
        queue.add_request(r)
    while queue:
        r = queue.pop_request()
        ledger.take_back(r.blocks)
        c.after_step([(r, 0)])
        assert c.on_finished(r, aborted=False, tool_called=lambda _: ToolCall("t", "hermes"))
    assert len(c.pins) == n
    assert calls["_insert"] <= 2 * n and calls["continued_by"] <= 10 * n, calls


def test_an_arrival_reads_the_program_table_from_its_head(monkeypatch):
    """100k programs: an arrival reads O(1) of the table when nobody is idle
    (it used to copy the whole table on every arrival)."""
    table = ProgramTable(max_programs=200_000)
    for i in range(100_000):
        program = table.open(f"s{i}", now=float(i) / 1000, arrival=float(i) / 1000)
        table.arrive(program, now=float(i) / 1000)  # a request of it is queued
    reads = Counter()
    busy = Program.busy

    def counted(program):
        reads["busy"] += 1
        return busy.fget(program)

    monkeypatch.setattr(Program, "busy", property(counted))
    for t in range(1000):
        table.arrive(table.open(f"new{t}", now=100.0, arrival=100.0), now=100.0)
        assert table.pop_idle(now=100.0, horizon_s=600.0) == []
    assert reads["busy"] == 0
    assert table.pop_idle(now=600.5, horizon_s=600.0) == []  # all busy: seen now, none left
    assert reads["busy"] == 501  # exactly the ones past the horizon


def test_a_failed_allocation_reads_only_the_pins_it_releases(monkeypatch):
    """50k pins: covering a 2-block shortfall reads a handful of pins in
    release order (it used to sort them all)."""
    n = 50_000
    c, ledger, clock = controller(pool_size=4 * n, pressure_policy="yield")
    for i in range(n):
        clock.now = float(i)
        run(c, ledger, Req(f"a{i}", f"S{i}", [2 * i, 2 * i + 1]))
    read = Counter()
    original = c.releaser._releasable

    def releasable(pins):
        for pin in original(pins):
            read["pins"] += 1
            yield pin

    monkeypatch.setattr(c.releaser, "_releasable", releasable)
    newcomer = Req("n", None, [10 * n])
    c.on_arrival(newcomer, None)
    result = c.releaser.retry_with_pins_released(
        newcomer, lambda: "blocks", shortfall=2, keep=frozenset(), running=False,
        preempted=False, waiting=True, anything_running=True)
    assert result == "blocks" and len(c.pins) == n - 1  # the latest program's pin went
    assert read["pins"] <= 2, read


def test_a_queued_turn_is_kept_only_in_the_heaps_of_its_bounds_that_are_on():
    """A bound that is off (inf; aging by default) is never passed, so a queued
    turn is not kept in its heap (each entry would later be popped stale: a
    step's `firsts` reads them all). The order is the same either way."""
    import math

    n, popped = 1000, {}
    for delay, aging, entries_per_turn in ((math.inf, math.inf, 1), (3600.0, math.inf, 2),
                                           (3600.0, 3600.0, 3)):
        c, ledger, clock = controller(pool_size=10 * n, max_turn_delay_s=delay,
                                      max_turn_aging_s=aging)
        queue = c.queue.lane_queue()
        requests = [Req(f"r{i}", f"S{i % 7}", [3 * i, 3 * i + 1]) for i in range(n)]
        for i, r in enumerate(requests):
            clock.now = float(i)
            c.on_arrival(r, {"continuum_tool": "t"})
            queue.add_request(r)
        entries = len(queue._heap) + sum(map(len, queue._aging.values()))
        assert entries == entries_per_turn * n, entries
        order = []
        while queue:
            r = queue.pop_request()
            order.append(r.request_id)
            c.after_step([(r, 0)], queue.first_of if queue else None)
        popped[entries_per_turn] = order
    assert popped[1] == popped[2] == popped[3]
