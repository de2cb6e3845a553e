"""The candidate policies of issue 12 on hand-worked cases, without vLLM:
the shrunk duration CDF (no cliff at K), the pressure-aware pin cost, and
release by value."""

from __future__ import annotations

import math
import random

import pytest
from tests.unit.test_controller import Clock, Ledger, Req, run

from vllm_continuum.config import load_config
from vllm_continuum.core.controller import PinController
from vllm_continuum.core.durations import ToolDurations
from vllm_continuum.core.pin_value import PoolState, marginal_blocks, pin_pressure
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.shrinkage import MixedCDF, shrunk_cdf, shrunk_mean
from vllm_continuum.core.tool_calls import ToolCall
from vllm_continuum.core.ttl import ContinuumTTLPolicy, TurnEnd, optimal_ttl
from vllm_continuum.core.ttl_policies import make_ttl_policy
from vllm_continuum.core.workload import WorkloadModel
from vllm_continuum.metrics.stats import ContinuumStats


# ------------------------------------------------------------- the mixture
def test_a_mixture_weighs_its_parts():
    cdf = MixedCDF(((0.5, [1.0, 2.0]), (0.5, [4.0])))
    assert [cdf(t) for t in (0.5, 1, 2, 3.9, 4)] == [0, 0.25, 0.5, 0.5, 1.0]
    assert MixedCDF((), 1.0)(1.0) == pytest.approx(1 - math.exp(-1))


def test_shrinkage_weights_follow_the_sample_counts():
    d = ToolDurations(limit=100)
    assert shrunk_cdf(d, "t", 8) == MixedCDF(((0.0, []), (0.0, [])), 1.0)  # Exp(1) only
    for _ in range(8):
        d.add("t", 1.0)
    for _ in range(16):
        d.add("u", 3.0)
    cdf = shrunk_cdf(d, "t", 8)
    # own: 8/(8+8) = 1/2; all tools (24 samples): 24/32 of the rest; Exp(1): 8/32 of it
    assert [w for w, _ in cdf.parts] == [0.5, 0.5 * 0.75]
    assert cdf.exp_weight == 0.5 * 0.25
    assert cdf(1.0) == pytest.approx(0.5 + 0.375 * 8 / 24 + 0.125 * (1 - math.exp(-1)))


@pytest.mark.parametrize("parts, exp_weight, benefit, expected", [
    # tau=1: .5*4-1 = 1; 10 >= B cannot win
    (((0.5, [1.0]), (0.5, [10.0])), 0.0, 4.0, 1.0),
    # tau=1: 15-1 = 14; tau=10: 30-10 = 20
    (((0.5, [1.0]), (0.5, [10.0])), 0.0, 30.0, 10.0),
    # Exp(1) alone: ln B (the paper's cold start), 0 when B <= 1
    ((), 1.0, 5.0, math.log(5)),
    ((), 1.0, 0.8, 0.0),
    # a free pin: the slowest sample, or forever with the Exp(1) part
    (((1.0, [1.0, 7.0]),), 0.0, math.inf, 7.0),
    (((0.5, [1.0, 7.0]),), 0.5, math.inf, math.inf),
    (((1.0, [1.0]),), 0.0, 0.0, 0.0),
])
def test_best_ttl_by_hand(parts, exp_weight, benefit, expected):
    assert MixedCDF(parts, exp_weight).best_ttl(benefit) == pytest.approx(expected)


def test_best_ttl_with_an_exp_part_matches_a_fine_grid():
    """Between samples the value is concave: the optimum may sit at ln(w_exp B)."""
    cdf = MixedCDF(((0.5, [0.2, 6.0]),), 0.5)
    for benefit in (3.0, 12.0, 40.0):
        grid = [i / 1000 for i in range(0, 40_000)]
        best = max(grid, key=lambda t: cdf(t) * benefit - t)
        got = cdf.best_ttl(benefit)
        assert cdf(got) * benefit - got == pytest.approx(cdf(best) * benefit - best, abs=2e-3)


def test_one_empirical_part_is_eq2():
    rng = random.Random(3)
    for _ in range(200):
        durations = sorted(round(rng.expovariate(1.0), 1) for _ in range(rng.randint(1, 30)))
        benefit = rng.uniform(0, 4)
        assert MixedCDF(((1.0, durations),)).best_ttl(benefit) == optimal_ttl(durations, benefit)


def continuum(k=100, c0=30.0, **kwargs) -> ContinuumTTLPolicy:
    workload = WorkloadModel(history_limit=1000, queueing_window=8, program_window=50)
    return ContinuumTTLPolicy(workload, PrefillProfile(c0, 0.0, 0.0), k, 1e9, **kwargs)


def test_a_rare_slow_tool_earns_its_own_ttl_after_a_few_calls():
    """90 `cat`s of 0.1 s and 5 `pytest`s of 10 s, B = 30 s. With K = 50
    pytest is on the all-tools CDF: tau = 0.1 (28.4 - 0.1 beats 30 - 10).
    Shrunk with k0 = 8: F(0.1) = 8/13 * 95/103 * 90/95 + ... = 0.542, value
    16.2; F(10) ~ 1, value 20: pytest keeps its pin until it returns."""
    cliff, shrunk = continuum(k=50), continuum(k=50, prior_samples=8)
    for p in (cliff, shrunk):
        for _ in range(90):
            p.workload.tools.of(None).durations.add("cat", 0.1)
        for _ in range(5):
            p.workload.tools.of(None).durations.add("pytest", 10.0)
    assert cliff.decide(TurnEnd("s", "pytest", 10)).ttl_s == 0.1
    decision = shrunk.decide(TurnEnd("s", "pytest", 10))
    assert (decision.source, decision.ttl_s) == ("shrunk CDF", 10.0)
    assert shrunk.decide(TurnEnd("s", "cat", 10)).ttl_s == 0.1


def test_eta_is_shrunk_toward_one_by_the_programs_seen():
    """Two programs of 2 and 4 turns: eta = -Corr(k, N-k) over their turns
    is 0.61; with k0 = 8 it counts 2/10: 0.2 * 0.61 + 0.8 = 0.92, so
    B = T * eta + reload = 10 * 0.92 + 1 with T = 10 s."""
    p = continuum(k=0, c0=1.0, prior_samples=8)
    p.workload.queueing.add(10.0)
    p.workload.programs.add(2)
    p.workload.programs.add(4)
    eta = p.workload.programs.eta
    assert eta == pytest.approx(0.61, abs=0.01)
    assert shrunk_mean(eta, 2, 1.0, 8) == pytest.approx(0.2 * eta + 0.8)
    # No durations: Exp(1) alone, so tau = ln(B).
    assert p.decide(TurnEnd("s", "x", 10)).ttl_s == pytest.approx(math.log(10 * (0.2 * eta + 0.8) + 1))


def test_shrunk_with_no_samples_is_the_papers_cold_start():
    assert continuum(c0=5.0, prior_samples=8).decide(TurnEnd("s", "x", 10)).ttl_s == (
        pytest.approx(math.log(5))
    )


# ------------------------------------------------------------ pressure cost
@pytest.mark.parametrize("pool, marginal, expected", [
    (None, 4, 1.0),  # nothing known: Eq. 2 charges all
    (PoolState(free_blocks=10, demand_blocks=5), 4, 0.0),  # the free pool covers the queue
    (PoolState(free_blocks=10, demand_blocks=12), 4, 0.5),  # 2 of its 4 blocks are wanted
    (PoolState(free_blocks=0, demand_blocks=30), 4, 1.0),
    (PoolState(free_blocks=0, demand_blocks=30), 0, 0.0),  # adds no block: free
])
def test_pin_pressure_by_hand(pool, marginal, expected):
    assert pin_pressure(pool, marginal) == expected


@pytest.mark.parametrize("pool, expected", [
    (None, 1.0),  # Eq. 2: .5 -> 2/3-.5, 1 -> 4/3-1 = 1/3 best; 8 >= B
    (PoolState(free_blocks=0, demand_blocks=100), 1.0),  # saturated: Eq. 2
    (PoolState(free_blocks=100, demand_blocks=0), 8.0),  # quiet: until the slowest returns
    # 19 of 20 marginal blocks wanted: pressure .95, B' = 2.1: 1 still wins
    (PoolState(free_blocks=0, demand_blocks=19), 1.0),
    # 1 of 20 wanted: pressure .05, B' = 40: tau=8 gives 32 against 25.7 at 1
    (PoolState(free_blocks=0, demand_blocks=1), 8.0),
])
def test_pressure_aware_ttl(pool, expected):
    p = continuum(k=0, c0=2.0, pin_cost="pressure")
    for d in (0.5, 1.0, 8.0):
        p.workload.tools.of(None).durations.add("t", d)
    decision = p.decide(TurnEnd("s", "t", 10, marginal_blocks=20, pool=pool))
    assert decision.ttl_s == expected
    assert decision.contested_ttl_s == 1.0  # held against waiting requests: Eq. 2's TTL


def test_demand_cost_pins_until_someone_waits_then_eq2():
    """pin_cost: demand charges nothing at creation, whatever the pool: the
    TTL is the cap; waiting requests get the blocks after Eq. 2's TTL (1 s)."""
    p = continuum(k=0, c0=2.0, pin_cost="demand")
    for d in (0.5, 1.0, 8.0):
        p.workload.tools.of(None).durations.add("t", d)
    busy = PoolState(free_blocks=0, demand_blocks=100)
    decision = p.decide(TurnEnd("s", "t", 10, marginal_blocks=20, pool=busy))
    assert (decision.ttl_s, decision.contested_ttl_s) == (1e9, 1.0)  # 1e9: the test's cap


def eq2_controller(pool_state=None, **settings):
    settings = {"ttl_policy": "continuum", "cold_start_samples": 0,
                "max_session_pinned_fraction": 1.0, **settings}
    config = load_config(use_env=False, **settings)
    ledger, clock = Ledger(100), Clock()

    def policy(cfg, workload):
        if cfg.ttl_policy != "continuum":
            return make_ttl_policy(cfg, workload)
        return ContinuumTTLPolicy(
            workload, PrefillProfile(2.0, 0.0, 0.0), 0, cfg.max_ttl_s,
            pin_cost=cfg.pin_cost,
        )

    extra = {"pool_state": pool_state} if pool_state else {}
    c = PinController(config, ledger, ContinuumStats(writer=None), block_size=4,
                      hash_block_size=4, clock=clock, ttl_policy=policy, **extra)
    for d in (0.5, 1.0, 8.0):
        c.workload.tools.of(None).durations.add("t", d)
    return c, ledger, clock


def test_the_controller_passes_the_pool_state_and_the_marginal_blocks():
    quiet = lambda counted: PoolState(free_blocks=50, demand_blocks=0)  # noqa: E731
    c, ledger, _ = eq2_controller(quiet, pin_cost="pressure")
    assert run(c, ledger, Req("a1", "A", [1, 2, 3]), tool="t")
    assert c.pins.get("A").ttl_s == 8.0
    # Without a pool-state source (today's adapter) or with pin_cost: always, Eq. 2.
    for c, ledger, _ in (eq2_controller(pin_cost="pressure"), eq2_controller(quiet, pin_cost="always")):
        assert run(c, ledger, Req("a1", "A", [1, 2, 3]), tool="t")
        assert c.pins.get("A").ttl_s == 1.0


def test_a_pin_of_blocks_others_already_hold_costs_nothing():
    busy = lambda counted: PoolState(free_blocks=0, demand_blocks=100)  # noqa: E731
    c, ledger, _ = eq2_controller(busy, pin_cost="pressure")
    assert run(c, ledger, Req("a1", "A", [1, 2, 3]), tool="t")
    assert c.pins.get("A").ttl_s == 1.0  # its 3 blocks are wanted: Eq. 2
    ledger.take_back([1, 2])  # a running request of B holds A's first blocks...
    b = Req("b1", "B", [1, 2])
    c.on_arrival(b, None)
    assert c.on_finished(b, aborted=False, tool_called=lambda _: ToolCall("t", "hermes"))
    assert c.pins.get("B").ttl_s == 8.0  # ...so its pin adds no block


def test_a_cheap_pin_gives_way_to_waiting_requests_once_past_eq2s_ttl():
    """Made on a quiet pool, A's pin gets 8 s (`pin_cost: pressure`) or the cap
    (`demand`, what ships) where Eq. 2 gives 1 s. Under `hold`, a waiting
    request that needs its blocks while other work runs is kept waiting for
    the first second, then gets them; a `forever` pin (no contested TTL) is
    held its whole TTL."""
    quiet = lambda counted: PoolState(free_blocks=50, demand_blocks=0)  # noqa: E731
    for ttl_policy, cost, released_at in (("continuum", "pressure", 1.0), ("continuum", "demand", 1.0),
                                          ("forever", "always", None)):
        c, ledger, clock = eq2_controller(quiet, pin_cost=cost, ttl_policy=ttl_policy)
        assert run(c, ledger, Req("a1", "A", [1, 2, 3]), tool="t")
        newcomer = Req("n", None, [8, 9])
        c.on_arrival(newcomer, None)
        for now in (0.5, 1.0):
            clock.now = now
            got = c.releaser.retry_with_pins_released(
                newcomer, lambda: "blocks", shortfall=2, keep=frozenset(), running=False,
                preempted=False, waiting=True, anything_running=True,
            )
            assert (got == "blocks") is (now == released_at), (cost, now)
        assert (c.pins.get("A") is None) is (released_at is not None)


def test_marginal_blocks_are_those_only_the_holder_references():
    refs = {1: 1, 2: 1, 6: 2}.get
    assert marginal_blocks([1, 2, 6, 6], refs) == 2  # 6 is shared; duplicates count once
    assert marginal_blocks([1, 2], refs, keep={2}) == 1  # the requester's own hit frees nothing
