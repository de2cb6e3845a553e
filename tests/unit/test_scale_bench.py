"""`vllm-continuum scale-bench` end to end at its smallest: every scenario at
two loads, ours and stock, a few steps; the report's structure, not its timings
(the benchmark's numbers: docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest

from vllm_continuum.cli import main

SCENARIOS = ["a", "b", "c", "d", "e"]


@pytest.fixture(scope="module")
def report(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("scale-bench") / "report.json"
    code = main(["scale-bench", "--scale", "0.002", "--steps", "3", "--budget", "60", "--setup-budget", "60",
                 "--model-dir", tiny_model_dir, "--out", str(out)])
    assert code == 0
    return json.loads(out.read_text())


def test_every_scenario_ran_at_both_loads_on_both_schedulers(report):
    assert sorted(report["results"]) == SCENARIOS
    for key, runs in report["results"].items():
        assert sorted(runs, key=int) == ["1", "10"], key
        assert runs["10"]["n"] > runs["1"]["n"] >= 1
        for load, run in runs.items():
            for side in ("ours", "stock"):
                result = run[side]
                assert result["aborted"] is None, (key, load, side)
                for metric in ("steps", "arrivals"):
                    stats = result[metric]
                    assert stats["count"] >= 1
                    assert 0 < stats["p50_us"] <= stats["p99_us"] <= stats["max_us"]


def test_the_report_checks_each_scenario_against_the_target(report):
    assert report["target"] == {"ratio": 1.2, "slack_us": 50.0}
    assert report["command"].startswith("vllm-continuum scale-bench")
    for key in SCENARIOS:
        check = report["checks"][key]
        assert check["verdict"] in ("PASS", "FAIL")
        assert (check["verdict"] == "FAIL") == bool(check["why"])
        assert set(check["growth"]) >= {"steps", "arrivals"}
    assert "snapshots" in report["checks"]["e"]["growth"]  # the metrics snapshot, timed


def test_the_state_is_the_scenarios(report):
    """What each scenario sets up is there at the end on our scheduler."""
    ours = {key: runs["10"]["ours"]["state"] for key, runs in report["results"].items()}
    assert ours["a"]["sessions"] >= report["results"]["a"]["10"]["n"]
    assert ours["c"]["pinned_blocks"] >= report["results"]["c"]["10"]["n"]
    assert ours["d"]["max_pins_of_a_session"] >= 1
    assert ours["e"]["max_pins_of_a_session"] >= report["results"]["e"]["10"]["n"]


def test_layers_break_our_cost_down_by_real_configurations(tiny_model_dir, tmp_path, capsys):
    """`--layers`: our hooks alone, then with the lane queue, then as shipped, beside
    stock in one run; each layer is a scheduler of its own configuration."""
    from continuum_lab.sim.scale_bench import LAYERS

    out = tmp_path / "layers.json"
    assert main(["scale-bench", "--scenarios", "d", "--loads", "1", "--scale", "0.05", "--steps", "4",
                 "--layers", "--model-dir", tiny_model_dir, "--out", str(out)]) == 0
    run = json.loads(out.read_text())["results"]["d"]["1"]
    assert set(run) >= set(LAYERS)
    for name in LAYERS:
        assert run[name]["aborted"] is None and run[name]["admitted"] >= 1, name
    # The layers are what they say: pins only as shipped, our tables on every one of ours.
    assert run["ours"]["state"]["pins"] >= 1
    assert run["hooks"]["state"]["pins"] == run["queue"]["state"]["pins"] == 0
    printed = capsys.readouterr().out
    assert "where our cost goes" in printed and "adds us/request" in printed
    assert "--layers" in json.loads(out.read_text())["command"]
