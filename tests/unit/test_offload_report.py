"""`matrix --report offload` (lab/continuum_lab/sim/offload_report.py): every
policy against stock with the same host tier, figures by hand; and the
offload grid names policies the simulator knows."""

from __future__ import annotations

import math

import pytest

from continuum_lab.sim.matrix import load_matrix
from continuum_lab.sim.offload_report import offload_cells, offload_tables
from continuum_lab.sim.policies import POLICIES, split_offload

CELL = "coding-agent overload (0.25/s, 40 programs, h100-llama3.1-8b)"


def row(label, seed, jct, programs, sources=(0, 0, 1)):
    return {"cell": CELL, "label": label, "seed": seed, "jct_mean_s": jct,
            "program_jct_s": dict(zip("abc", programs)),
            "resume_tokens": dict(zip(("gpu", "host_tier", "computed"), sources))}


ROWS = [
    row("stock", 0, 400, (400, 400, 400)), row("stock", 1, 800, (800, 800, 800)),
    row("stock+offload-3x-pcie5", 0, 200, (100, 200, 300), (1, 2, 1)),
    row("stock+offload-3x-pcie5", 1, 200, (200, 200, 200), (1, 2, 1)),
    row("default+offload-3x-pcie5", 0, 100, (50, 100, 360), (3, 1, 0)),
    row("default+offload-3x-pcie5", 1, 400, (400, 400, 400), (3, 1, 0)),
    row("default", 0, 250, (250, 250, 250)), row("default", 1, 250, (250, 250, 250)),
    row("stock+offload-1x-pcie5", 0, 300, (300, 300, 300)),
    row("stock+offload-1x-pcie5", 1, 300, (300, 300, 300)),
]


def test_each_policy_against_stock_with_the_same_tier():
    cells = offload_cells(ROWS)
    tiers = cells[CELL]
    assert list(tiers) == ["3x-pcie5", "1x-pcie5"]
    f = tiers["3x-pcie5"]["default+offload-3x-pcie5"]
    assert f["gain"] == pytest.approx(math.sqrt(2.0 * 0.5))  # seeds: 200/100, 200/400
    assert f["worst"] == 0.5
    assert f["worst_program"] == 2.0  # seed 1, every program at twice its stock+offload JCT
    assert f["slower"] == 1.0
    assert f["vs_stock"] == pytest.approx(math.sqrt(4.0 * 2.0))
    assert f["sources"] == "75% / 25% / 0%"
    # A row without a tier is judged against each tier's stock.
    assert tiers["1x-pcie5"]["default"]["gain"] == pytest.approx(1.2)
    assert "default+offload-3x-pcie5" not in tiers["1x-pcie5"]


def test_the_targets_table_names_what_was_missed():
    text = "\n".join(offload_tables(ROWS))
    assert f"| {CELL} | 3x-pcie5 | 1.000x | 0.50x | 2.00x | mean JCT >= 1.5x; a seed below 1.00x |" in text


def test_the_offload_grid_names_known_policies():
    spec = load_matrix("matrix-offload")
    for label in spec.policies:
        name, _ = split_offload(label)
        assert name in POLICIES, label
    assert {split_offload(p)[1].label for p in spec.policies if split_offload(p)[1]} == {
        "1x-pcie5", "3x-pcie5", "1x-pcie4", "3x-pcie4"}
