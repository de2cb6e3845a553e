"""The tool-aware retention rule (`ttl_policy: hazard`, core/hazard_ttl.py):
its horizon by hand and by brute force, the conditional re-decision, hints,
the cap and calls that return just after it; and the revisit wired through
the pin releaser."""

from __future__ import annotations

import math
import random

import pytest

from vllm_continuum.config import ContinuumConfig
from vllm_continuum.core import hazard_ttl
from vllm_continuum.core.hazard_ttl import HazardTTLPolicy, best_horizon
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.ttl import TurnEnd
from vllm_continuum.core.ttl_policies import make_ttl_policy
from vllm_continuum.core.workload import CONTENTION_WINDOW_S, WorkloadModel

# A profile whose reload is a flat 2 s: B = 2 s + T.
FLAT = PrefillProfile(c0=2.0, c1=0.0, c2=0.0)


def policy(durations: dict[str, list[float]], *, max_ttl_s: float = 30.0, revisit_s: float = 1e9,
           queueing_s: float = 0.0, prior_samples: float = 3.0, contested: bool = True,
           **kw) -> HazardTTLPolicy:
    """The rule over these durations; the pool contested (memory has a price) unless told."""
    workload = WorkloadModel(history_limit=1000, queueing_window=16, program_window=16)
    if contested:
        workload.blocks_short(0.0)
    workload.tools.track_running_calls(max_ttl_s + 0.5, forget_after_s=600.0, max_calls=1000)
    for tool, ds in durations.items():
        for d in ds:
            workload.tools.of(None).durations.add(tool, d)
    if queueing_s:
        workload.queueing.add(queueing_s)
    return HazardTTLPolicy(workload, FLAT, max_ttl_s, prior_samples=prior_samples, revisit_s=revisit_s, **kw)


def turn(tool: str, hint: float | None = None) -> TurnEnd:
    return TurnEnd("s", tool, 1000, hinted_ttl_s=hint)


def value(parts, elapsed, h, benefit, cost):
    """P(D <= h | D > a) * B - c * E[min(D, h) - a | D > a], by enumeration,
    a sample known to outlast the limit enumerated as infinite."""
    pts = [(x, w / (len(s) + k)) for w, s, k in parts for x in [*s, *[math.inf] * k] if x > elapsed]
    surv = sum(w for _, w in pts)
    p = sum(w for x, w in pts if x <= h) / surv
    hold = sum(w * (min(x, h) - elapsed) for x, w in pts) / surv
    return p * benefit - cost * hold


# ------------------------------------------------------------ the horizon
@pytest.mark.parametrize(
    "samples, elapsed, limit, benefit, cost, expected",
    [
        # all return by 1 s; holding to 1 costs at most 1 s of memory for a 2 s saving
        ([0.5, 1.0], 0.0, 30.0, 2.0, 1.0, 1.0),
        # every call outlasts the limit: release now, whatever the benefit
        ([60.0, 120.0], 0.0, 30.0, 1e6, 0.0, 0.0),
        # nobody waits (cost 0): hold to the last return within the limit
        ([1.0, 10.0, 25.0, 100.0], 0.0, 30.0, 1.0, 0.0, 25.0),
        # contested and slow: 10 s of memory for a 2 s saving is not worth it
        ([10.0, 12.0], 0.0, 30.0, 2.0, 1.0, 0.0),
        # a tie with releasing (0.5 * 2 - 1 = 0) goes to releasing
        ([1.0, 100.0], 0.0, 30.0, 2.0, 1.0, 0.0),
        # already waited past every recorded call: nothing is known, hold to the limit
        ([1.0, 2.0], 5.0, 30.0, 100.0, 1.0, 30.0),
    ],
)
def test_best_horizon_by_hand(samples, elapsed, limit, benefit, cost, expected):
    assert best_horizon(((1.0, sorted(samples), 0),), elapsed, limit, benefit, cost) == expected


def test_best_horizon_matches_brute_force():
    rng = random.Random(3)
    for _ in range(300):
        a = sorted(round(rng.expovariate(0.2), 1) for _ in range(rng.randint(1, 15)))
        b = sorted(round(rng.expovariate(1.0), 1) for _ in range(rng.randint(1, 15)))
        w = rng.random()
        parts = ((w, a, rng.choice([0, 0, 1, 3])), (1 - w, b, rng.choice([0, 2])))
        elapsed = rng.choice([0.0, 0.5, 2.0, 5.0])
        limit = rng.choice([3.0, 10.0, 30.0])
        benefit, cost = rng.uniform(0, 10), rng.choice([0.0, 0.3, 1.0])
        got = best_horizon(parts, elapsed, limit, benefit, cost)
        if not any(x > elapsed for _, s, _ in parts for x in s) and not any(k for *_, k in parts):
            assert got == max(limit, elapsed)  # past every recorded call: nothing known, held
            continue
        candidates = [x for _, s, _ in parts for x in s if elapsed < x <= limit]
        values = [value(parts, elapsed, h, benefit, cost) for h in candidates]
        best = max([0.0, *values])
        if best <= 1e-12:
            assert got == elapsed
        else:
            assert value(parts, elapsed, got, benefit, cost) == pytest.approx(best)
            assert got == min(h for h, v in zip(candidates, values) if v >= best - 1e-9)


def test_best_horizon_over_many_samples_is_the_same_in_numpy(monkeypatch):
    """A busy tool's history (hundreds of samples a part) is scanned in numpy:
    the same horizon, to the bit, as the Python pass, ties included."""
    rng = random.Random(5)
    cases = []
    for _ in range(400):
        step = rng.choice([None, 0.5, 1.0])  # rounded durations make ties

        def draw(scale):
            x = rng.expovariate(1 / scale)
            return round(x / step) * step if step else x

        a = sorted(draw(rng.choice([0.5, 3.0, 30.0])) for _ in range(rng.choice([70, 300, 1000])))
        b = [draw(rng.choice([1.0, 5.0, 40.0])) for _ in range(rng.choice([0, 100, 1000]))]
        b = sorted(b + a if rng.random() < 0.5 else b)  # all tools' history holds the tool's own
        w = rng.random()
        parts = ((w, a, rng.choice([0, 3])), (1 - w, b, rng.choice([0, 7])))
        cases.append((parts, rng.choice([0.0, 0.3, 2.0, 5.0]), rng.choice([10.0, 30.5]),
                      rng.uniform(0, 30), rng.choice([0.0, 0.02, 0.3, 1.0])))
    in_numpy = [best_horizon(*case) for case in cases]
    monkeypatch.setattr(hazard_ttl, "VECTOR_FROM", math.inf)
    assert [best_horizon(*case) for case in cases] == in_numpy
    assert len(set(in_numpy)) > 100  # the cases reach many different horizons


def test_decisions_on_merged_samples_kept_between_changes_are_the_same():
    """The rule keeps each tool's merged samples until a duration or a late
    call is recorded: every decision, at turn end and at revisits, is the
    one a fresh merge gives, as the histories and the calls past the cap move."""
    rng = random.Random(11)
    kept = policy({"ci": [rng.uniform(20, 200) for _ in range(200)],
                   "view": [rng.expovariate(2.0) for _ in range(300)]})
    fresh = policy({})
    fresh.workload = kept.workload  # the same state, merged anew at every decision
    fresh._merged_parts = lambda key, tools, parts: hazard_ttl.Merged.of(parts)
    decided = set()
    for i in range(300):
        if i % 7 == 0:
            kept.workload.tools.of(None).durations.add(rng.choice(["ci", "view"]), rng.uniform(0, 100))
        if i % 50 == 0:
            kept.workload.tool_called(None, f"s{i}", "ci", 0.0)  # outlasts the cap: counted late
            kept.workload.tools.of(None).running.advance(100.0)
        tool, elapsed = rng.choice(["ci", "view"]), rng.choice([0.0, 0.5, 5.0, 20.0])
        tokens = rng.choice([100, 1000, 10_000])
        got = kept.hold_for(tool, elapsed, tokens)
        assert got == fresh.hold_for(tool, elapsed, tokens)
        decided.add(got[0])
    assert len(decided) > 5
    assert set(kept._merged) == {(None, "ci"), (None, "view")}


# ------------------------------------------------------------ the rule
def test_a_fast_tool_is_held_and_a_tool_slower_than_the_cap_is_not():
    """`ci` is held only while the all-tools prior (3 of 33 weights) says it
    might still return, and released at the revisit."""
    p = policy({"view": [0.1, 0.2, 0.3] * 10, "ci": [60.0, 90.0, 200.0] * 10})
    assert p.decide(turn("view")).ttl_s == pytest.approx(0.3)
    first = p.decide(turn("ci")).ttl_s
    assert 0 < first <= 0.3
    assert p.revisit("ci", first, 1000) == 0.0


def test_a_slow_but_returning_tool_is_held_as_forever_holds_it():
    """A browse call of 5-25 s is held to its last return, although its 2 s
    saving would not pay for the wait at a price of 1 per second held."""
    durations = {"browse": [5.0, 8.0, 12.0, 25.0] * 5}
    assert policy(durations).decide(turn("browse")).ttl_s == 25.0
    assert policy(durations, idle_cost=1.0).decide(turn("browse")).ttl_s == 0.0


def test_memory_costs_nothing_while_the_pool_is_not_contested():
    """A small context (its saving below what the wait costs at the price) and
    a tool that returns within the cap: let go while allocations fail for lack
    of blocks, held as `forever` holds it once none has failed for
    CONTENTION_WINDOW_S (nobody would use the memory)."""
    durations = {"forced": [25.0]}
    contested = policy(durations, idle_cost=1.0)
    assert contested.decide(turn("forced")).ttl_s == 0.0
    assert policy(durations, idle_cost=1.0, contested=False).decide(turn("forced")).ttl_s == 25.0
    contested.workload.tick(CONTENTION_WINDOW_S)  # the failure at 0 s still counts
    assert contested.decide(turn("forced")).ttl_s == 0.0
    contested.workload.tick(CONTENTION_WINDOW_S + 0.1)
    assert contested.decide(turn("forced")).ttl_s == 25.0


def test_queueing_after_a_lost_context_is_part_of_the_benefit():
    durations = {"browse": [5.0, 8.0, 12.0, 25.0] * 5}
    assert policy(durations, idle_cost=1.0, queueing_s=0.0).decide(turn("browse")).ttl_s == 0.0
    assert policy(durations, idle_cost=1.0, queueing_s=60.0).decide(turn("browse")).ttl_s == 25.0


def test_a_tool_counts_after_a_handful_of_its_own_calls():
    """Beside 300 fast calls, three 100 s calls of a new tool already make
    it hold only as long as the fast ones could return, and its revisit releases it."""
    fast = [0.1, 0.2, 0.5] * 100
    p = policy({"view": fast, "ci": [100.0, 120.0, 150.0]})
    first = p.decide(turn("ci")).ttl_s
    assert first <= 0.5  # the pooled fast calls' share, at most
    assert p.revisit("ci", first, 1000) == 0.0


def test_the_decision_is_revisited_conditioned_on_the_elapsed_time():
    """Half the calls return in 1 s, half in 100 s: at first the pin is
    worth holding for the fast half; once 1 s has passed without a return,
    the call is a slow one and the pin goes."""
    p = policy({"approval": [1.0, 100.0] * 10})
    assert p.decide(turn("approval")).ttl_s == 1.0
    assert p.revisit("approval", 1.0, 1000) == 0.0
    # At 10 s, with calls of 20 s among them, it holds on again.
    p = policy({"approval": [1.0, 20.0, 100.0] * 10})
    assert p.revisit("approval", 10.0, 1000) == pytest.approx(10.0)


def test_revisits_come_at_most_every_revisit_s():
    p = policy({"browse": [5.0, 8.0, 12.0, 25.0] * 5}, revisit_s=5.0)
    decision = p.decide(turn("browse"))
    assert decision.ttl_s == 5.0 and decision.revisable
    assert p.revisit("browse", 5.0, 1000) == 5.0
    # Past every recorded call nothing is known: held as `forever`, to the cap.
    assert p.revisit("browse", 25.0, 1000) == 5.0
    assert p.revisit("browse", 30.0, 1000) == 0.0


def test_a_call_that_returns_just_after_the_cap_is_held_to_the_cap():
    """A tool that times out at the cap is measured just past it (30.01 s):
    within `late_return_s` of the cap it counts as returning in time, and
    its pin is held to the cap (never past it), not let go a little early."""
    durations = {"test": [10.0, 30.01] * 10}
    assert policy(durations).revisit("test", 27.0, 1000) == pytest.approx(3.0)
    assert policy(durations, late_return_s=0.0).revisit("test", 27.0, 1000) == 0.0
    assert policy({"test": [10.0, 31.0] * 10}).revisit("test", 27.0, 1000) == 0.0


def test_a_cold_tool_that_outlasts_every_recorded_call_is_let_go():
    """No `ci` call has returned yet and the only durations recorded are
    fast: the pin is held for the pooled fast share, and once the call has
    outlasted every call ever recorded it goes (a tool with calls of its
    own would be held there: `test_revisits_come_at_most_every_revisit_s`)."""
    p = policy({"view": [0.1, 0.2, 0.3] * 10}, revisit_s=5.0)
    first = p.decide(turn("ci")).ttl_s
    assert 0 < first <= 0.3
    assert p.revisit("ci", first, 1000) == 0.0


def test_a_cold_tool_is_held_while_few_calls_are_recorded():
    """Outlasting 9 recorded calls is weak evidence (1 in 10 for a call
    like them): held as `forever`; outlasting 10 lets it go."""
    assert policy({"view": [0.5] * 9}, revisit_s=5.0).revisit("test", 1.0, 1000) == 5.0
    assert policy({"view": [0.5] * 10}, revisit_s=5.0).revisit("test", 1.0, 1000) == 0.0


def test_calls_still_out_past_the_cap_count_before_any_returns():
    """Beside fast calls, three 10 s calls were recorded, so a cold `ci`
    call at 5 s is held (the pooled calls that ran that long returned in
    time). Ten `ci` calls still out past the cap are samples beyond it: the
    same pin is let go."""
    p = policy({"view": [0.1, 0.2, 0.3] * 10, "browse": [10.0] * 3}, revisit_s=5.0)
    assert p.revisit("ci", 5.0, 1000) == 5.0
    for i in range(10):
        p.workload.tool_called(None, f"s{i}", "ci", now=float(i))
    p.workload.tools.of(None).running.advance(40.0)
    assert p.workload.tools.of(None).running.overdue("ci") == 10
    assert p.revisit("ci", 5.0, 1000) == 0.0
    # The fast tool keeps its pins: its own calls all return in time.
    assert p.decide(turn("view")).ttl_s >= 0.3


def test_a_late_call_that_returns_becomes_its_real_duration():
    p = policy({"view": [0.1] * 10})
    p.workload.tool_called(None, "s", "ci", now=0.0)
    p.workload.tools.of(None).running.advance(31.0)
    assert p.parts("ci", p.workload.tools.get(None))[0][2] == 1
    p.workload.tool_returned(None, "s", "ci", 95.0)
    own = p.parts("ci", p.workload.tools.get(None))[0]
    assert (list(own[1]), own[2]) == ([95.0], 0)


def test_hints_win_and_the_cap_holds():
    p = policy({"ci": [200.0] * 10}, max_ttl_s=30.0)
    hinted = p.decide(turn("ci", hint=12.0))
    assert (hinted.ttl_s, hinted.source, hinted.revisable) == (12.0, "hint", False)
    assert p.decide(turn("ci", hint=500.0)).ttl_s == 30.0
    # The cap bounds the horizon (a 200 s tool returns after it: no pin) and revisits.
    p = policy({"slow": [20.0, 40.0] * 10}, max_ttl_s=30.0)
    assert p.decide(turn("slow")).ttl_s == 20.0
    assert p.revisit("slow", 20.0, 1000) == 0.0
    assert p.revisit("slow", 31.0, 1000) == 0.0


def test_without_any_duration_it_holds_as_forever_and_looks_again():
    p = policy({}, revisit_s=5.0)
    decision = p.decide(turn("anything"))
    assert (decision.ttl_s, decision.source, decision.revisable) == (5.0, "no durations", True)


def test_make_ttl_policy_builds_it():
    assert isinstance(make_ttl_policy(ContinuumConfig(ttl_policy="hazard"),
                                      WorkloadModel(1000, 16, 16)), HazardTTLPolicy)


# ------------------------------------------------------------ in the controller
def hazard_controller(durations: dict[str, list[float]]):
    from tests.unit.test_controller import Ledger
    from vllm_continuum.config import load_config
    from vllm_continuum.core.controller import PinController
    from vllm_continuum.metrics.stats import ContinuumStats

    ledger, now = Ledger(100), [0.0]
    stats = ContinuumStats(writer=None)
    c = PinController(load_config(use_env=False, ttl_policy="hazard"), ledger, stats,
                      block_size=4, hash_block_size=4, clock=lambda: now[0])
    for tool, ds in durations.items():
        for d in ds:
            c.workload.tools.of(None).durations.add(tool, d)
    c.workload.queueing.add(10.0)  # turns that lost their context queued 10 s: B is about 10 s
    return c, ledger, now, stats


def step(c, now, t):
    now[0] = t
    c.begin_step()
    c.end_step()


APPROVAL = {"approval": [1.0, 100.0] * 10}  # returns in 1 s or in 100 s


def test_the_controller_revisits_a_hazard_pin_and_releases_it_once_the_tool_looks_slow():
    """The approval's pin holds for 1 s; at that TTL the rule sees a slow
    call and lets it expire."""
    from tests.unit.test_controller import Req, run

    c, ledger, now, stats = hazard_controller(APPROVAL)
    assert run(c, ledger, Req("a1", "A", [1, 2, 3]), tool="approval")
    assert c.pins.get("A").expires_at == pytest.approx(1.0)
    step(c, now, 1.0)
    assert c.pins.get("A") is None
    assert stats.releases_by_reason["expired"] == 1
    assert stats.ttl_revisits[("approval", "released")] == 1


def test_the_controller_holds_a_returning_tool_through_its_revisits_to_the_cap():
    """`browse` (5-25 s) is held through every revisit (every 5 s), past its
    last recorded return (nothing is known there), and expires at the cap."""
    from tests.unit.test_controller import Req, run

    c, ledger, now, stats = hazard_controller({"browse": [5.0, 8.0, 12.0, 25.0] * 5})
    assert run(c, ledger, Req("b1", "B", [4, 5, 6]), tool="browse")
    assert c.pins.get("B").expires_at == pytest.approx(5.0)
    for t in (5.0, 10.0, 15.0, 20.0, 25.0):
        step(c, now, t)
        assert c.pins.get("B") is not None
    step(c, now, 30.0)
    assert c.pins.get("B") is None
    assert stats.releases_by_reason["expired"] == 1
    assert stats.ttl_revisits[("browse", "held")] == 5


def test_the_controller_counts_a_call_out_past_the_cap_until_it_returns():
    """A's `ci` call is counted once it has run past the cap (as of a pin's
    revisit), and replaced by its real duration when A's next turn arrives."""
    from tests.unit.test_controller import Req, run

    c, ledger, now, stats = hazard_controller({"browse": [5.0, 8.0, 12.0, 25.0] * 5})
    assert run(c, ledger, Req("a1", "A", [1, 2, 3]), tool="ci")
    step(c, now, 20.0)
    assert run(c, ledger, Req("b1", "B", [4, 5, 6]), tool="browse")
    assert c.workload.tools.of(None).running.overdue("ci") == 0
    step(c, now, 31.0)  # A's pin expires at the cap; B's revisit reads the clock
    assert c.pins.get("A") is None and c.pins.get("B") is not None
    assert c.workload.tools.of(None).running.overdue("ci") == 1
    now[0] = 95.0
    c.on_arrival(Req("a2", "A", [1, 2, 3, 4]), None)  # the call returned after 95 s
    assert c.workload.tools.of(None).running.overdue("ci") == 0
    assert list(c.workload.tools.of(None).durations.of("ci").sorted) == [95.0]


def test_the_controller_lets_a_cold_slow_call_go_at_its_first_revisit():
    from tests.unit.test_controller import Req, run

    c, ledger, now, stats = hazard_controller({"view": [0.1, 0.2, 0.3] * 10})
    assert run(c, ledger, Req("a1", "A", [1, 2, 3]), tool="ci")
    pin = c.pins.get("A")
    assert pin.expires_at <= 0.3
    step(c, now, pin.expires_at)
    assert c.pins.get("A") is None
    assert stats.ttl_revisits[("ci", "released")] == 1


def test_a_hazard_pin_whose_next_turn_is_queued_is_held_to_the_cap():
    """The next turn came back (its call returned) but waits in the queue:
    the rule has nothing left to decide, and the pin is held as `forever`
    holds it, up to `max_ttl_s`, not let go at the revisit its TTL asked
    for (where the same pin without a queued turn goes: the first
    controller test)."""
    from tests.unit.test_controller import Req, run

    c, ledger, now, stats = hazard_controller(APPROVAL)
    assert run(c, ledger, Req("a1", "A", [1, 2, 3]), tool="approval")
    pin = c.pins.get("A")
    assert pin.expires_at == pytest.approx(1.0)
    c.on_arrival(Req("a2", "A", [1, 2, 3, 4]), None)  # its next turn: queued, not yet admitted
    assert "a2" in pin.waiters
    for t in (1.0, 10.0, 29.0):
        step(c, now, t)
        assert c.pins.get("A") is pin
    assert pin.expires_at == pytest.approx(30.0)
    assert stats.ttl_revisits.get(("approval", "released"), 0) == 0
