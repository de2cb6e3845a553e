"""The measurement matrix: its figures by hand, and one tiny grid end to end."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from tests.scheduler.test_sim import SMALL

from vllm_continuum.experiments.sim.matrix import (
    CellSpec, MatrixSpec, cell_summary, load_matrix, run_matrix,
)


def row(label, seed, jct, preemptions=0, one_shot=0.0):
    return {"label": label, "seed": seed, "jct_mean_s": jct, "preemptions": preemptions,
            "one_shot_ttft_p99_s": one_shot}


def test_cell_summary_by_hand():
    rows = [row("stock", 0, 10, 2, 1.0), row("stock", 1, 40, 0, 2.0),
            row("oracle", 0, 5, 0, 1.0), row("oracle", 1, 20, 0, 2.0),
            row("p", 0, 10, 1, 2.0), row("p", 1, 50, 0, 2.0)]
    s = cell_summary(rows)
    assert s["oracle"]["gain"] == pytest.approx(2.0) and s["oracle"]["vs_best"] == 1.0
    assert s["p"]["gain"] == pytest.approx(math.sqrt(0.8)) and s["p"]["worst"] == 0.8
    assert s["p"]["vs_oracle"] == pytest.approx(math.sqrt(500) / 10)
    assert s["p"]["one_shot_p99_vs_stock"] == pytest.approx(math.sqrt(2.0))
    assert (s["p"]["preemptions"], s["stock"]["preemptions"]) == (1, 2)


def test_the_shipped_grid_loads_and_names_known_policies():
    from vllm_continuum.experiments.sim.policies import POLICIES

    spec = load_matrix()
    assert set(spec.policies) <= set(POLICIES)
    assert {load for _, load, _ in spec.grid(quick=True)} == {spec.quick_load}
    assert len(spec.grid(quick=True, load="none")) == len(spec.cells)
    assert len(spec.grid(quick=False)) == sum(len(c.loads) for c in spec.cells)


def test_a_tiny_matrix_end_to_end(tmp_path):
    cost = tmp_path / "small.yaml"
    cost.write_text(yaml.safe_dump(SMALL.model_dump()))
    spec = MatrixSpec(seeds=[1, 2], policies=["stock", "oracle", "continuum-pressure"],
                      cells=[CellSpec(workload="cpu-agent", cost_model=str(cost), programs=3,
                                      loads={"heavy": 1.0})], quick_load="heavy")
    assert run_matrix(spec, tmp_path / "out", quick=True) == 0
    report = (tmp_path / "out" / "matrix.md").read_text()
    assert "cpu-agent heavy" in report and "| continuum-pressure |" in report
    assert (tmp_path / "out" / "matrix_heatmap.png").is_file()
    # Both seeds in two processes: the same figures as one after the other.
    assert run_matrix(spec, tmp_path / "one", jobs=1) == 0
    assert run_matrix(spec, tmp_path / "two", jobs=2) == 0
    rows = [json.loads((tmp_path / d / "matrix.json").read_text())["rows"] for d in ("one", "two")]
    assert len(rows[0]) == 6 and rows[0] == rows[1]
