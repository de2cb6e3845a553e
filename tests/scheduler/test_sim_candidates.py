"""Issue 12's candidate policies run in the simulator, and the pool state
`pin_cost: pressure` reads comes from the scheduler the simulator drives."""

from __future__ import annotations

import pytest
from tests.scheduler.test_sim import SMALL, _run

from vllm_continuum.core.hazard_ttl import HazardTTLPolicy
from vllm_continuum.core.pin_value import PoolState
from continuum_lab.sim.driver import SimClock
from continuum_lab.sim.policies import CANDIDATES, HAZARD_CONSTANTS, build_scheduler
from continuum_lab.workload_spec import load_spec


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cand") / "profile.yaml"
    SMALL.prefill_profile().save(path)
    return str(path)


def test_candidates_carry_their_settings_and_a_pool_state(profile_path):
    built = build_scheduler("adaptive-yield", SMALL, SimClock(), prefill_profile_path=profile_path)
    config = built.scheduler.continuum.config
    assert (config.pin_cost, config.queue_order, config.pressure_policy) == (
        "pressure", "sessionless_first", "yield")
    # An empty scheduler: every usable block free, nothing waiting.
    assert built.scheduler.continuum.maker.pool_state() == PoolState(SMALL.num_gpu_blocks - 1, 0)


@pytest.mark.parametrize("policy", sorted(CANDIDATES))
def test_every_candidate_completes_every_turn(policy, profile_path):
    trace = load_spec("cpu-agent").with_overrides(num_programs=6, arrival_rate=1.0, seed=2).generate()
    run = _run(trace, policy, profile_path)
    assert len(run.turns) == sum(len(p.turns) for p in trace)
    assert sum(run.meta["continuum_stats"]["resumes_by_outcome"].values()) > 0


@pytest.mark.parametrize("label", sorted(HAZARD_CONSTANTS))
def test_hazard_constant_labels_change_only_their_constant(label, profile_path):
    built = build_scheduler(label, SMALL, SimClock(), prefill_profile_path=profile_path)
    policy = built.scheduler.continuum.maker.ttl_policy
    shipped = build_scheduler("hazard", SMALL, SimClock(), prefill_profile_path=profile_path)
    reference = shipped.scheduler.continuum.maker.ttl_policy
    assert isinstance(policy, HazardTTLPolicy) and policy.max_ttl_s == reference.max_ttl_s
    for name in ("prior_samples", "idle_cost", "revisit_s"):
        expected = HAZARD_CONSTANTS[label].get(name, getattr(reference, name))
        assert getattr(policy, name) == expected, name
    assert policy.benefit_s(40_000) == reference.benefit_s(40_000)  # the same prefill profile
