"""Fairness by outcome: each program's JCT against the same program's on the
baseline, one-shot percentiles against the baseline's, makespan."""

from __future__ import annotations

import math

import pytest

from continuum_lab.outcomes import outcome, outcome_table
from continuum_lab.results import ProgramRecord, RunResult, TurnRecord


def _run(label: str, ends: dict[str, float], one_shot_ttfts=()) -> RunResult:
    run = RunResult(label, 0.0, 0.0)
    run.programs = [ProgramRecord(p, 0.0, end, 3) for p, end in ends.items()]
    run.one_shot = [TurnRecord(f"c{i}", 0, None, float(i), t, 2 * t, 10, 0, 1, 0)
                    for i, t in enumerate(one_shot_ttfts)]
    return run


def test_programs_are_matched_by_id_and_judged_one_by_one():
    stock = _run("stock", {"a": 10.0, "b": 10.0, "c": 10.0, "d": 20.0}, [1.0, 1.0, 3.0])
    policy = _run("policy", {"a": 5.0, "b": 12.0, "c": 10.5, "d": 10.0}, [0.5, 0.5, 6.0])
    o = outcome(policy, stock)
    assert o["programs_compared"] == 4
    assert o["programs_slower_10pct"] == pytest.approx(0.25)  # b: 1.2x; c: 1.05x is not
    assert o["worst_program_ratio"] == pytest.approx(1.2)
    assert o["median_program_ratio"] == pytest.approx((0.5 + 1.05) / 2)
    assert o["makespan_ratio"] == pytest.approx(20.0 / 12.0)
    assert o["one_shot_ttft_p50_ratio"] == pytest.approx(0.5)
    assert o["one_shot_latency_p99_ratio"] > 1


def test_without_one_shots_their_ratios_are_blank():
    stock, policy = _run("stock", {"a": 2.0}), _run("p", {"a": 1.0})
    assert math.isnan(outcome(policy, stock)["one_shot_ttft_p99_ratio"])
    table = outcome_table([stock, policy], "stock")
    assert "| p | 0% | 0.50x | 0.50x | 2.00x |" in table and "one-shot" not in table
    assert outcome_table([policy], "stock") == ""
