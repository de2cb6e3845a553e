"""The speed probe's reading (calibration/speed_probe.py): how much slower than
its cost model the machine ran beside a replay, and the cost model scaled by it."""

from __future__ import annotations

import math

import pytest

from continuum_lab.calibration.probes import Point
from continuum_lab.calibration.speed_probe import (
    modelled_s, replay_speed, run_speed, scaled, speed_factor)
from continuum_lab.sim.cost_model import CostModel, Linear

COST = CostModel(name="truth", kind="linear", block_size=32, num_gpu_blocks=96, max_num_seqs=64,
                 max_num_batched_tokens=1024, max_model_len=4096, api_overhead_s=0.05,
                 linear=Linear(step_s=0.01, per_token_s=2e-4, per_pair_s=2e-8, per_seq_s=1e-3))


def probe_records(cost: CostModel, factor: float, spike: float = 1.0) -> list[dict]:
    """What the probe records on a machine `factor` times slower than `cost`, three
    repeats of each point; `spike` multiplies one repeat of the first point."""
    shapes = [Point("prefill", {"n": 512, "cached": 0}, [[(512, 0)]], 0.0, True),
              Point("prefill", {"n": 256, "cached": 1024}, [[(256, 1024)]], 0.0, True),
              Point("decode", {"batch": 4, "context": 512}, [[(1, 530)] * 4], 0.0, False)]
    out = []
    for repeat in range(3):
        for k, p in enumerate(shapes):
            p.measured_s = factor * modelled_s(cost, p) * (spike if (repeat, k) == (0, 0) else 1.0)
            out.append(p.to_json())
    return out


def test_the_factor_is_measured_over_modelled():
    assert speed_factor(probe_records(COST, 1.0), COST) == pytest.approx(1.0)
    assert speed_factor(probe_records(COST, 1.3), COST) == pytest.approx(1.3)
    # One repeat that another process slowed 5x does not move it: repeats by their median.
    assert speed_factor(probe_records(COST, 1.3, spike=5.0), COST) == pytest.approx(1.3)


def test_a_replay_is_read_before_and_after():
    meta = {"speed_probe": {"before": {"points": probe_records(COST, 1.2), "failed": []},
                            "after": {"points": probe_records(COST, 1.4), "failed": ["decode (4, 512): ..."]}}}
    speed = replay_speed(meta, COST)
    assert speed["before"] == pytest.approx(1.2) and speed["after"] == pytest.approx(1.4)
    assert speed["replay"] == pytest.approx(math.sqrt(1.2 * 1.4))
    # The run's: its replays' together, a replay without a probe left out.
    assert run_speed([speed, None, {"replay": 1.5}]) == pytest.approx(math.sqrt(math.sqrt(1.2 * 1.4) * 1.5))
    assert run_speed([None]) is None
    # Recorded without a probe, or half of one: nothing to apply.
    assert replay_speed({}, COST) is None
    assert replay_speed({"speed_probe": {"before": meta["speed_probe"]["before"]}}, COST) is None
    # Every probe of one side failed: nothing to read there either.
    assert replay_speed({"speed_probe": {**meta["speed_probe"], "after": {"points": [], "failed": ["x"]}}},
                        COST) is None


def test_scaled_is_the_same_machine_that_much_slower():
    slow = scaled(COST, 1.5)
    for p in map(Point.from_json, probe_records(COST, 1.0)):
        assert modelled_s(slow, p) == pytest.approx(1.5 * modelled_s(COST, p))
    assert slow.api_overhead_s == pytest.approx(0.075)
    assert (slow.num_gpu_blocks, slow.max_num_batched_tokens) == (96, 1024)
    assert speed_factor(probe_records(slow, 1.0), COST) == pytest.approx(1.5)

