"""`vllm-continuum predict RUN_DIR --cost-model FILE`: each round's replays of a
`compare` run, simulated on the trace they sent, beside what they measured.

For every recorded replay (rounds.py: round, flavour, its records and sent
trace) the simulator runs the same trace on the calibrated cost model, with
the scheduler and settings that server had (settings.py) and the API
overhead added (overhead.py). The cost model's pool and context window are
set to the run's (`compare --num-blocks`, block size, `--max-model-len`), since
those are what ran; the report says so when they differed. The report
(tables.py) goes to RUN_DIR/predict/ (`--out`), with every turn measured
beside predicted in turns.csv, and to docs/results with `--publish`.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tqdm import tqdm

from vllm_continuum.experiments.live.rounds import load_rounds
from vllm_continuum.experiments.prediction.overhead import as_client_saw, engine_trace
from vllm_continuum.experiments.prediction.settings import STOCK, sim_policy
from vllm_continuum.experiments.prediction.tables import (
    TURN_COLUMNS,
    Pair,
    diagnosis_table,
    outcome_table,
    summary_lines,
    turn_rows,
)
from vllm_continuum.experiments.publish import emit_report
from vllm_continuum.experiments.report import write_runs
from vllm_continuum.experiments.sim.cost_model import CostModel, load_cost_model

# compare's setup key -> the cost model's field
RUN_SHAPE = {"num_blocks": "num_gpu_blocks", "block_size": "block_size", "max_model_len": "max_model_len"}


def for_run(cost: CostModel, setup: dict) -> tuple[CostModel, list[str]]:
    """The cost model with the run's pool and window, and what was changed."""
    update = {field: setup[key] for key, field in RUN_SHAPE.items()
              if key in setup and getattr(cost, field) != setup[key]}
    notes = [f"cost model's {field} {getattr(cost, field)} -> {value} (the run's)"
             for field, value in update.items()]
    return cost.model_copy(update=update), notes


def _calibrated_load(cost: CostModel) -> str:
    """The machine's load while it was calibrated, to read each replay's beside."""
    load = (getattr(cost, "calibration", None) or {}).get("load_average_before_after")
    return f"; calibrated at a load average of {load[0]}-{load[1]}" if load else ""


def _label(policy: str, settings: dict[str, str]) -> str:
    if policy == STOCK:
        return "vLLM"
    return f"ours: {settings.get('TTL_POLICY')}, {settings.get('QUEUE_ORDER')}, {settings.get('PRESSURE_POLICY')}"


def run_predict(run_dir: Path, cost_model: str, *, out_dir: Path | None = None,
                publish: str | None = None, command: str = "") -> int:
    from vllm_continuum.experiments.sim.run import prepare_profile, simulate

    run_dir = Path(run_dir)
    results = run_dir / "results.json"
    if not results.is_file():
        raise SystemExit(f"{run_dir} has no results.json: give the --out directory of a compare run")
    setup = json.loads(results.read_text()).get("setup", {})
    cost, notes = for_run(load_cost_model(cost_model), setup)
    out_dir = Path(out_dir or run_dir / "predict")
    out_dir.mkdir(parents=True, exist_ok=True)
    fallback_profile = prepare_profile(cost, out_dir)
    overhead = cost.api_overhead_s
    pairs: list[Pair] = []
    for rec in tqdm(load_rounds(run_dir), desc="predict", unit="replay"):
        policy, settings, why = sim_policy(rec.run, run_dir)
        sim, _ = simulate(engine_trace(rec.sent, overhead), cost, policy, fallback_profile,
                          extra_settings=settings, progress=False)
        sim.label = rec.label
        sim.meta["round"] = rec.round
        pairs.append(Pair(rec.round, rec.label, _label(policy, settings), rec.run,
                          as_client_saw(sim, overhead), why))
        notes += why
    write_runs([q.predicted for q in pairs], out_dir, extra={"setup": {"run_dir": str(run_dir),
               "cost_model": cost.model_dump(), "command": command}})
    with (out_dir / "turns.csv").open("w", newline="") as f:
        csv.writer(f).writerows([TURN_COLUMNS, *turn_rows(pairs)])
    lines = [
        f"## Predicted (simulator, cost model {cost.name}) beside measured ({run_dir})", "",
        f"workload {setup.get('workload')}, hints {setup.get('hints')}, pool {cost.num_gpu_blocks} blocks of "
        f"{cost.block_size}; API overhead added per request: {overhead * 1000:.0f} ms"
        + ("" if overhead else " (the cost model has none: not calibrated by `calibrate`)")
        + _calibrated_load(cost),
        "", outcome_table(pairs), "", "Where they differ:", "", diagnosis_table(pairs), "",
        *summary_lines(pairs),
    ]
    if notes:
        lines += ["", *[f"- {n}" for n in dict.fromkeys(notes)]]
    lines += ["", f"every turn, measured beside predicted: {out_dir / 'turns.csv'}",
              f"cost model: {cost.description.split('. ')[0]}.",
              f"reproduce: {command or 'vllm-continuum predict'}"]
    emit_report(lines, out_dir, publish, command)
    return 0
