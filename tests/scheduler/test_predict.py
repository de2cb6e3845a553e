"""`vllm-continuum predict` end to end on a run whose "measurements" are the
simulator's own: a compare-like run directory is written from simulated
replays (with an API overhead), and predicting it with the same cost model
must give every figure back exactly: the sent trace, the settings pairing
and the overhead's shift lose nothing (prediction/, live/sent_trace.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from continuum_lab.calibration.speed_probe import scaled, speed_factor
from continuum_lab.live.rounds import load_rounds, save_round
from continuum_lab.prediction.command import run_predict
from continuum_lab.prediction.overhead import as_client_saw, engine_trace
from continuum_lab.report import summarize, write_runs
from continuum_lab.results import RunResult
from continuum_lab.sim.cost_model import CostModel, Linear
from continuum_lab.sim.policies import sim_config
from continuum_lab.sim.run import simulate
from continuum_lab.workload_spec import load_spec
from tests.unit.test_speed_probe import probe_records

COST = CostModel(name="truth", kind="linear", block_size=32, num_gpu_blocks=96, max_num_seqs=64,
                 max_num_batched_tokens=1024, max_model_len=4096, api_overhead_s=0.05,
                 linear=Linear(step_s=0.01, per_token_s=2e-4, per_pair_s=2e-8, per_seq_s=1e-3))


# A step log's batches: a cold prefill, two decodes, a chunk beside a decode.
LOGGED_BATCHES = [[[512, 0]], [[1, 600], [1, 300]], [[200, 512], [1, 700]]]


def _step_log(path: Path, machine: CostModel) -> dict:
    """A step log (continuum_lab/step_log.py's format) of LOGGED_BATCHES run on `machine`,
    and a step before the replay's window (a speed probe's) that must not count."""
    lines, t = [{"t": 5.0, "batch": [[64, 0]], "step_s": 99.0}], 10.0
    for batch in LOGGED_BATCHES:
        step_s = machine.step_time([tuple(r) for r in batch])
        lines.append({"t": t, "batch": batch, "step_s": step_s, "cycle_s": step_s})
        t += step_s
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return {"path": str(path.relative_to(path.parent.parent)), "window": [10.0, t]}


def _measured_run(tmp_path, machine: CostModel = COST, probe: CostModel | None = None,
                  step_log: bool = False) -> tuple[Path, list[RunResult]]:
    """A compare-like run directory whose "measurements" the simulator made on `machine`,
    with the speed probe's records of `probe` (a machine: its speed against COST) and,
    with `step_log`, each replay's steps as that machine ran them."""
    trace = load_spec("cpu-mixed").with_overrides(num_programs=6, arrival_rate=1.0, seed=1).generate()
    run_dir = tmp_path / "run"
    profile = tmp_path / "profile.yaml"
    machine.prefill_profile().save(profile)
    measured: list[RunResult] = []
    for rnd, policy, label in [(1, "stock", "stock"), (1, "forever-sessionless-first", "forever"),
                               (2, "forever-sessionless-first", "forever"), (2, "stock", "stock")]:
        run, sim = simulate(engine_trace(trace, machine.api_overhead_s), machine, policy, profile,
                            progress=False)
        run = as_client_saw(run, machine.api_overhead_s)
        run.label = label
        run.meta = {"round": rnd, "flavour": label}
        if probe:
            factor = speed_factor(probe_records(probe, 1.0), COST)
            run.meta["speed_probe"] = {w: {"points": probe_records(COST, factor), "failed": []}
                                       for w in ("before", "after")}
        if step_log:
            run.meta["step_log"] = _step_log(run_dir / "steps" / f"r{rnd}-{label}.jsonl", machine)
        if policy != "stock":
            run.meta["continuum_config"] = sim_config(sim.settings).model_dump(mode="json")
            run.meta["continuum_settings"] = {"ttl_policy": "forever"}
        save_round(run, trace, run_dir)
        measured.append(run)
    write_runs(measured, run_dir, extra={"setup": {"workload": "cpu-mixed", "hints": "all",
                                                   "num_blocks": 96, "block_size": 32, "max_model_len": 4096}})
    return run_dir, measured


def _predicted(run_dir: Path) -> dict:
    data = json.loads((run_dir / "predict" / "results.json").read_text())
    return {(r["meta"]["round"], s["label"]): s for r, s in zip(data["runs"], data["summaries"])}


def test_predict_gives_back_a_run_the_simulator_made(tmp_path):
    cost_path = tmp_path / "truth.yaml"
    cost_path.write_text(yaml.safe_dump(COST.model_dump()))
    run_dir, measured = _measured_run(tmp_path)
    trace = load_rounds(run_dir)[0].sent
    assert run_predict(run_dir, str(cost_path), command="vllm-continuum predict (test)") == 0
    report = (run_dir / "predict" / "report.md").read_text()
    predicted = _predicted(run_dir)
    assert len(predicted) == 4
    for run in measured:
        m, p = summarize(run), predicted[(run.meta["round"], run.label)]
        for key in ("jct_mean_s", "makespan_s", "reuse_of_prev_prompt", "one_shot_ttft_p99_s",
                    "prefilled_tokens"):
            assert p[key] == pytest.approx(m[key], rel=1e-6, abs=1e-9), (m["label"], key)
    assert "| 1 | forever | ours: forever, sessionless_first, hold |" in report
    assert "API overhead added per request: 50 ms" in report
    assert "within 15% in 2 of 2 rounds" in report and "overall yes" in report
    assert "stock's mean JCT over rounds, measured" in report
    import csv

    rows = list(csv.DictReader((run_dir / "predict" / "turns.csv").open()))
    assert len(rows) == 4 * sum(len(p.turns) for p in trace)
    # (the sent trace keeps times to the microsecond)
    assert all(float(r["ttft_meas_s"]) == pytest.approx(float(r["ttft_pred_s"]), abs=1e-5) for r in rows)


def test_predict_at_the_speed_probed_beside_each_replay(tmp_path):
    """The "machine" ran 1.3x slower than the cost model: predicted as calibrated,
    every mean JCT comes out fast; at the speed the probe measured, exact."""
    cost_path = tmp_path / "truth.yaml"
    cost_path.write_text(yaml.safe_dump(COST.model_dump()))
    run_dir, measured = _measured_run(tmp_path, machine=scaled(COST, 1.3), probe=scaled(COST, 1.3))
    assert run_predict(run_dir, str(cost_path), command="vllm-continuum predict (test)") == 0
    predicted = _predicted(run_dir)
    for run in measured:
        m, p = summarize(run), predicted[(run.meta["round"], run.label)]
        assert p["jct_mean_s"] == pytest.approx(m["jct_mean_s"], rel=1e-6), m["label"]
    report = (run_dir / "predict" / "report.md").read_text()
    assert "speed probe meas / model: before" in report and "| 1 | stock | 1.30x | 1.30x | 1.30x | 1.30x |" in report
    assert re.search(r"stock: mean-JCT error by round [-+]0\.0% to [-+]0\.0% \(within 15% in 2 of 2 "
                     r"rounds\); on the cost model as calibrated, not scaled by the speed probes, -", report)


def test_predict_at_the_speed_of_the_replays_own_steps(tmp_path):
    """The machine slowed during the replays (1.3x) where the probes beside them saw
    the cost model's speed: at the probed speed the prediction is fast; at the speed
    of the steps the server logged (measured over modelled, the probes' steps outside
    the replay's window left out), exact."""
    cost_path = tmp_path / "truth.yaml"
    cost_path.write_text(yaml.safe_dump(COST.model_dump()))
    run_dir, measured = _measured_run(tmp_path, machine=scaled(COST, 1.3), probe=COST, step_log=True)
    assert run_predict(run_dir, str(cost_path), command="vllm-continuum predict (test)") == 0
    data = json.loads((run_dir / "predict" / "results.json").read_text())
    assert all(r["meta"]["speed"]["run"] == pytest.approx(1.0) for r in data["runs"])
    report = (run_dir / "predict" / "report.md").read_text()
    modelled = sum(COST.step_time([tuple(r) for r in b]) for b in LOGGED_BATCHES)
    assert f"| 1 | stock | 3 |" in report and f"| {modelled:.1f} |" in report
    assert "| 1.30x | 1.30x | 1.30x |" in report  # all steps, decode only, with a prefill
    line = next(x for x in report.splitlines() if x.startswith("stock: mean-JCT error"))
    assert re.search(r"by round -\d+\.\d% to -\d+\.\d% \(within", line)  # fast at the probed speed
    assert re.search(r"own steps [-+]0\.0% to [-+]0\.0% \(within 15% in 2\)", line), line
