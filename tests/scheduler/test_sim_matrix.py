"""The measurement matrix: its figures by hand, and one tiny grid end to end."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from tests.scheduler.test_sim import SMALL

from continuum_lab.sim.matrix import (
    CellSpec, MatrixSpec, cell_summary, load_matrix, merge_rows, render_matrix, run_matrix, select_rows,
    targets_table,
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
    from continuum_lab.sim.policies import POLICIES

    spec = load_matrix()
    assert set(spec.policies) <= set(POLICIES)
    assert {load for _, load, _ in spec.grid(quick=True)} == {spec.quick_load}
    assert len(spec.grid(quick=True, load="none")) == sum("none" in c.loads for c in spec.cells)
    assert len(spec.grid(quick=False)) == sum(len(c.loads) for c in spec.cells)
    overload = spec.grid(quick=False, load="overload")
    assert {c.workload for c, _, _ in overload} >= {"swebench-final-context", "coding-agent"}
    assert all(c.load("overload").programs >= 40 for c, _, _ in overload
               if c.cost_model.startswith("h100"))


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
    # The report again from the rows, with the targets of one policy checked.
    assert render_matrix(rows[0], tmp_path / "again", target_policy="continuum-pressure") == 0
    again = (tmp_path / "again" / "matrix.md").read_text()
    assert "### Targets for `continuum-pressure`" in again and "| cpu-agent heavy" in again


def test_runs_merge_into_one_matrix_only_when_they_agree():
    row = lambda label, jct, seed=0: {"cell": "c", "seed": seed, "label": label, "jct_mean_s": jct}
    earlier = [row("stock", 10.0), row("default", 5.0)]
    later = [row("stock", 10.0), row("new", 4.0), row("stock", 9.0, seed=1)]
    assert merge_rows([earlier, later]) == [*earlier, row("new", 4.0), row("stock", 9.0, seed=1)]
    with pytest.raises(SystemExit, match="not of the same code"):
        merge_rows([earlier, [row("stock", 10.5)]])


def test_a_report_from_rows_keeps_the_policies_seeds_workloads_and_load_asked_for():
    row = lambda cell, label, seed=0: {"cell": f"{cell} (0.3/s, 40 programs)", "seed": seed, "label": label}
    rows = [row("ci-agent overload", "stock"), row("ci-agent heavy", "stock"), row("ci-agent heavy", "hazard"),
            row("ci-agent-mixed heavy", "stock"), row("ci-agent heavy", "stock", seed=1)]
    assert select_rows(rows) == rows
    assert select_rows(rows, workloads=["ci-agent"], load="heavy") == [rows[1], rows[2], rows[4]]
    assert select_rows(rows, policies=["stock"], seeds=[0], load="heavy") == [rows[1], rows[3]]
    assert select_rows(rows, workloads=["ci-agent-mixed"], load="overload") == []


def test_a_policy_run_apart_from_stock_is_judged_program_by_program():
    """Rows of separate runs carry per-program JCTs: the merged matrix
    computes the outcome against stock that one run would have."""
    row = lambda label, jcts: {"cell": "c", "seed": 0, "label": label, "jct_mean_s": sum(jcts.values()),
                               "preemptions": 0, "program_jct_s": jcts}
    stock, later = row("stock", {"p0": 10.0, "p1": 20.0}), row("new", {"p0": 12.0, "p1": 10.0})
    merged = {r["label"]: r for r in merge_rows([[stock], [later]])}
    assert merged["new"]["worst_program_ratio"] == pytest.approx(1.2)
    assert merged["new"]["programs_slower_10pct"] == 0.5
    assert cell_summary(list(merged.values()))["new"]["worst_program"] == pytest.approx(1.2)
    old = {k: v for k, v in later.items() if k != "program_jct_s"}  # a row from before: left as it was
    assert merge_rows([[stock], [old]])[1] == old


def test_targets_by_hand():
    summary = {"gain": 1.2, "worst": 0.97, "vs_best": 1.04, "one_shot_p99_vs_stock": 1.2,
               "preemptions": 3}
    cells = {"c": {"stock": {**summary, "gain": 1.0, "worst": 1.0, "vs_best": 1.2,
                             "preemptions": 2}, "p": summary}}
    row = targets_table(cells, "p")[-1]
    assert "| 1.040x (p) |" in row  # p is the best in its cell
    assert row.endswith("worst seed >= 0.98x stock; one-shot p99 TTFT <= 1.10x stock; "
                        "preemptions <= stock's |")
