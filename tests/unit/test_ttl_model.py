"""Continuum's TTL model (Eq. 2), its cold start, and the measured inputs
T, eta and PrefillReload, without vLLM."""

from __future__ import annotations

import math
import random

import pytest

from vllm_continuum.config import ContinuumConfig
from vllm_continuum.core.durations import DurationHistory
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.ttl import (
    ContinuumTTLPolicy,
    TurnEnd,
    exp1_ttl,
    optimal_ttl,
)
from vllm_continuum.core.ttl_policies import make_ttl_policy
from vllm_continuum.core.workload import Memoryfulness, SlidingMean, WorkloadModel


# ------------------------------------------------------------ tau* by hand
@pytest.mark.parametrize(
    "durations, benefit, expected",
    [
        # values: tau=0 -> 0, 1 -> .25*5-1=.25, 2 -> .5, 3 -> .75; 10 >= B never wins
        ([1, 2, 3, 10], 5.0, 3),
        # ties in P: three 1s count together: 1 -> .75*3-1 = 1.25 beats 4
        ([1, 1, 1, 4], 3.0, 1),
        # a tie in value (0 at tau=0 and at tau=1) goes to the shorter TTL
        ([1, 2], 2.0, 0),
        # tau = 0 wins: every duration exceeds the benefit
        ([5, 6], 2.0, 0),
        # durations of 0 (the turn came back at once) count at tau = 0
        ([0, 0, 3], 1.0, 0),
        # a huge reload cost: wait for the slowest call
        ([0.5, 2, 40, 300], 1e6, 300),
        ([], 5.0, 0),
        ([1, 2], 0.0, 0),
    ],
)
def test_optimal_ttl_by_hand(durations, benefit, expected):
    assert optimal_ttl(sorted(durations), benefit) == expected


def test_optimal_ttl_matches_brute_force():
    rng = random.Random(7)
    for _ in range(200):
        durations = sorted(round(rng.expovariate(1.0), 1) for _ in range(rng.randint(1, 30)))
        benefit = rng.uniform(0, 4)
        n = len(durations)
        candidates = [0.0, *durations]
        values = [sum(d <= t for d in durations) / n * benefit - t for t in candidates]
        best = max(values)
        expected = min(t for t, v in zip(candidates, values) if v >= best - 1e-12)
        assert optimal_ttl(durations, benefit) == pytest.approx(expected)


@pytest.mark.parametrize("benefit, expected", [(0.5, 0.0), (1.0, 0.0), (math.e, 1.0), (20.0, math.log(20))])
def test_exp1_cold_start_is_ln_b(benefit, expected):
    assert exp1_ttl(benefit) == pytest.approx(expected)


def test_exp1_formula_is_the_exp1_optimum():
    """Under Exp(1) durations the objective is (1 - e^-tau) B - tau: its maximum is ln B."""
    for benefit in (1.5, 3.0, 10.0):
        grid = [i / 1000 for i in range(0, 10_000)]
        best = max(grid, key=lambda t: (1 - math.exp(-t)) * benefit - t)
        assert exp1_ttl(benefit) == pytest.approx(best, abs=2e-3)


# --------------------------------------------------------------- cold start
def policy(k=3, c0=2.0, c1=0.0, queueing=0.0):
    workload = WorkloadModel(history_limit=50, queueing_window=8, program_window=50)
    if queueing:
        workload.queueing.add(queueing)
    return ContinuumTTLPolicy(workload, PrefillProfile(c0, c1, 0.0), k, max_ttl_s=1e9)


def test_cold_start_until_more_than_k_samples_in_all():
    p = policy(k=3, c0=5.0)  # B = 5 s: cold start gives ln 5
    for _ in range(3):
        p.workload.tools.of(None).durations.add("b", 0.5)
    decision = p.decide(TurnEnd("s", "a", 100))
    assert (decision.source, decision.ttl_s) == ("cold start", pytest.approx(math.log(5)))
    p.workload.tools.of(None).durations.add("a", 0.25)  # 4 samples in all, 1 of "a"
    decision = p.decide(TurnEnd("s", "a", 100))
    assert (decision.source, decision.ttl_s) == ("global CDF", 0.5)
    for _ in range(3):
        p.workload.tools.of(None).durations.add("a", 0.25)  # 4 of "a": more than K
    decision = p.decide(TurnEnd("s", "a", 100))
    assert (decision.source, decision.ttl_s) == ("tool CDF", 0.25)


def test_a_new_tool_borrows_the_global_cdf():
    p = policy(k=2, c0=3.0)
    for d in (0.2, 0.3, 0.4):
        p.workload.tools.of(None).durations.add("fast", d)
    decision = p.decide(TurnEnd("s", "new-tool", 10))
    assert (decision.source, decision.ttl_s) == ("global CDF", 0.4)


def test_short_tools_are_pinned_and_long_ones_are_not():
    p = policy(k=2, c0=1.0)  # B = 1 s
    for _ in range(5):
        p.workload.tools.of(None).durations.add("grep", 0.05)
        p.workload.tools.of(None).durations.add("build", 30.0)
    assert p.decide(TurnEnd("s", "grep", 10)).ttl_s == 0.05
    assert p.decide(TurnEnd("s", "build", 10)).ttl_s == 0


def test_queueing_delay_times_eta_is_part_of_the_benefit():
    p = policy(k=0, c0=0.1, queueing=4.0)  # B = T * eta + reload = 4 * 1 + 0.1
    for _ in range(3):
        p.workload.tools.of(None).durations.add("t", 3.0)
    assert p.decide(TurnEnd("s", "t", 10)).ttl_s == 3.0
    for _ in range(5):
        p.workload.programs.add(1)  # single-turn programs: no memory, eta = 0
    assert p.workload.eta == 0.0
    assert p.decide(TurnEnd("s", "t", 10)).ttl_s == 0  # B = 0.1 < 3 s


def test_hint_and_cap_apply_to_continuum_too():
    p = make_ttl_policy(ContinuumConfig(max_ttl_s=2.0), WorkloadModel(100, 8, 8))
    assert p.decide(TurnEnd("s", "t", 10, hinted_ttl_s=9)).ttl_s == 2.0
    assert make_ttl_policy(ContinuumConfig(ttl_policy="forever", max_ttl_s=7), WorkloadModel(100, 8, 8)).decide(
        TurnEnd("s", "t", 10)
    ).ttl_s == 7


# -------------------------------------------------------------- histories
def test_duration_history_is_bounded_and_sorted():
    h = DurationHistory(limit=3)
    for d in (5, 1, 3, 2):
        h.add(d)
    assert h.sorted == [1, 2, 3] and len(h) == 3  # 5 (the oldest) forgotten
    assert h.cdf(2) == pytest.approx(2 / 3)


def test_sliding_mean_window():
    m = SlidingMean(window=3)
    for v in (1, 2, 3, 4):
        m.add(v)
    assert m.mean == 3 and len(m) == 3


# --------------------------------------------------------------------- eta
def test_eta_is_one_for_fixed_length_programs():
    eta = Memoryfulness(window=100)
    for _ in range(50):
        eta.add(8)
    assert eta.eta == pytest.approx(1.0)


def test_eta_is_near_zero_for_geometric_lengths():
    """Geometric lengths are memoryless: the remaining turns do not depend on
    the turns served, so the pooled correlation is 0 in expectation. With
    4000 programs (about 16000 (k, N-k) pairs, correlated within a program)
    the sampling error is a few hundredths: 0.08 is a safe tolerance, and
    fixed lengths (eta = 1) or uniform lengths (eta about 0.5) are far away."""
    rng = random.Random(42)
    eta = Memoryfulness(window=4000)
    for _ in range(4000):
        n = 1
        while rng.random() < 0.75:
            n += 1
        eta.add(n)
    assert abs(eta.eta) < 0.08


def test_eta_window_forgets_old_programs():
    eta = Memoryfulness(window=10)
    rng = random.Random(1)
    for _ in range(200):
        eta.add(rng.randint(1, 30))
    for _ in range(10):
        eta.add(6)
    assert eta.eta == pytest.approx(1.0)


# ----------------------------------------------------------------- profile
def test_profile_fit_recovers_a_quadratic(tmp_path):
    truth = PrefillProfile(0.02, 3e-4, 2e-8)
    rng = random.Random(3)
    points = [(n, truth.seconds(n) * (1 + rng.uniform(-0.01, 0.01))) for n in
              (250, 500, 1000, 2000, 4000, 8000) for _ in range(3)]
    fitted = PrefillProfile.fit(points, source="synthetic")
    assert fitted.c1 == pytest.approx(3e-4, rel=0.1)
    assert fitted.c2 == pytest.approx(2e-8, rel=0.1)
    assert fitted.fit_error()[1] < 0.02
    path = tmp_path / "profile.yaml"
    fitted.save(path)
    loaded = PrefillProfile.load(path)
    assert loaded.seconds(3000) == pytest.approx(fitted.seconds(3000))


def test_profile_needs_three_lengths_and_valid_files(tmp_path):
    with pytest.raises(ValueError, match="3 distinct"):
        PrefillProfile.fit([(1, 0.1), (2, 0.2)], source="x")
    bad = tmp_path / "bad.yaml"
    bad.write_text("c0: 1\n")
    with pytest.raises(ValueError, match="not a prefill profile"):
        PrefillProfile.load(bad)


# ------------------------------------------------------ model-input edge cases
def test_a_decreasing_profile_fit_is_held_at_its_running_maximum():
    """A noisy fit with c2 < 0 would give the longest contexts a reload cost
    of 0 (and so a TTL of 0 exactly where a pin saves most)."""
    concave = PrefillProfile(0.01, 1e-3, -1e-7)  # peaks at 5,000 tokens, 0 near 10,100
    peak = concave.seconds(5_000)
    assert concave.seconds(9_000) == pytest.approx(peak)
    assert concave.seconds(50_000) == pytest.approx(peak)
    assert concave.seconds(2_000) < peak  # unchanged below the peak
    assert concave.clamp_note(4_000) is None and "decreases" in concave.clamp_note(8_192)
    assert PrefillProfile(0.5, -1e-4, 0.0).seconds(1_000) == pytest.approx(0.5)
    assert PrefillProfile().clamp_note(1_000_000) is None


def test_a_profile_with_non_finite_coefficients_is_refused(tmp_path):
    bad = tmp_path / "nan.yaml"
    bad.write_text("c0: .nan\nc1: 1e-4\nc2: 0\n")
    with pytest.raises(ValueError, match="finite"):
        PrefillProfile.load(bad)


def test_an_infinite_benefit_waits_for_the_slowest_return():
    assert optimal_ttl([0.5, 1.0, 7.0], math.inf) == 7.0
    assert optimal_ttl([0.5, 1.0, 7.0], math.nan) == 0.0
