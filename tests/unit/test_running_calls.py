"""Tool calls in flight (core/running_calls.py): a call out past the cap is
counted for its tool until it returns, is superseded, or its program is
forgotten; and the queues hold only what they must."""

from __future__ import annotations

import math

from vllm_continuum.core.running_calls import RunningCalls


def test_a_call_counts_once_it_has_run_past_the_cap_and_until_it_returns():
    calls = RunningCalls(overdue_after_s=30.5, forget_after_s=600.0)
    calls.start("a", "ci", now=0.0)
    calls.start("b", "ci", now=10.0)
    calls.advance(30.4)
    assert calls.overdue("ci") == 0
    calls.advance(30.5)
    assert (calls.overdue("ci"), calls.num_overdue) == (1, 1)
    calls.advance(41.0)
    assert calls.overdue("ci") == 2
    calls.returned("a")
    assert (calls.overdue("ci"), calls.num_overdue) == (1, 1)
    calls.returned("a")  # twice: nothing more
    assert calls.overdue("ci") == 1


def test_a_call_that_returned_in_time_never_counts():
    calls = RunningCalls(overdue_after_s=30.5, forget_after_s=600.0)
    calls.start("a", "view", now=0.0)
    calls.returned("a")
    calls.start("a", "ci", now=1.0)  # the session's next call
    calls.advance(31.0)
    assert calls.overdue("view") == 0 and calls.overdue("ci") == 0
    calls.advance(31.5)
    assert calls.overdue("ci") == 1 and calls.num_overdue == 1


def test_a_superseded_call_leaves_the_count():
    """A turn that did not continue the session's context ended in a new
    call: the old one is not waited for any more."""
    calls = RunningCalls(overdue_after_s=30.5, forget_after_s=600.0)
    calls.start("a", "ci", now=0.0)
    calls.advance(40.0)
    assert calls.overdue("ci") == 1
    calls.start("a", "view", now=41.0)
    assert calls.overdue("ci") == 0 and calls.num_overdue == 0 and len(calls) == 1


def test_a_call_that_never_returns_is_forgotten_with_its_program():
    calls = RunningCalls(overdue_after_s=30.5, forget_after_s=600.0)
    calls.start("a", "ci", now=0.0)
    calls.advance(599.0)
    assert calls.overdue("ci") == 1
    calls.advance(600.0)
    assert calls.overdue("ci") == 0 and len(calls) == 0


def test_without_a_cap_nothing_is_kept():
    """What every policy but `hazard` gets (`WorkloadModel` tracks nothing
    until a policy that reads the calls asks it to)."""
    calls = RunningCalls(overdue_after_s=math.inf, forget_after_s=math.inf)
    for i in range(1000):
        calls.start(f"s{i}", "ci", now=float(i))
    calls.advance(1e9)
    assert calls.num_overdue == 0 and not calls._started and not calls._late and len(calls) == 0


def test_the_queues_hold_the_calls_of_one_window_at_scale():
    """100k sessions, 2,000 calls a second for an hour, nine in ten
    returning at once: the start queue holds at most the calls of the last
    `overdue_after_s`, the late queue those still out of `forget_after_s`."""
    calls = RunningCalls(overdue_after_s=30.5, forget_after_s=600.0)
    sessions = 2_000  # calls a second, cycling over 100k session ids
    peak_started = peak_late = 0
    for t in range(0, 3600, 10):
        for i in range(sessions):
            s = f"s{(t // 10 * sessions + i) % 100_000}"
            calls.start(s, "ci", now=t + i / sessions)
            if i % 10:
                calls.returned(s)
        peak_started = max(peak_started, len(calls._started))
        peak_late = max(peak_late, len(calls._late))
    assert peak_started <= 4 * sessions
    assert peak_late <= 61 * sessions // 10
    assert calls.num_overdue == calls.overdue("ci") <= 61 * sessions // 10


def test_the_controller_tracks_calls_only_for_a_policy_that_reads_them():
    from vllm_continuum.config import load_config
    from vllm_continuum.core.controller import PinController
    from vllm_continuum.metrics.stats import ContinuumStats
    from tests.unit.test_controller import Ledger, Req, run

    for ttl_policy, tracked in (("forever", 0), ("hazard", 1)):
        ledger = Ledger(100)
        c = PinController(load_config(use_env=False, ttl_policy=ttl_policy), ledger,
                          ContinuumStats(writer=None), block_size=4, hash_block_size=4, clock=lambda: 0.0)
        assert run(c, ledger, Req("a1", "A", [1, 2, 3]), tool="ci")
        assert len(c.workload.tools.of(None).running) == tracked


def test_at_most_max_calls_are_kept_the_oldest_forgotten_first():
    """Session ids come from clients: with no idle horizon (inf), a flood of
    calls that never return still keeps at most `max_calls`."""
    calls = RunningCalls(overdue_after_s=30.5, forget_after_s=math.inf, max_calls=100)
    for i in range(10_000):
        calls.start(f"s{i}", "ci", now=float(i))
        assert len(calls) <= 100
    assert calls.num_overdue == calls.overdue("ci") == 69  # s9900..s9968 are out past 30.5 s
    assert len(calls._started) + len(calls._late) <= 100
    assert "s9999" in calls._running and "s9899" not in calls._running
