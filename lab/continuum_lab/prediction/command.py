"""`vllm-continuum predict RUN_DIR --cost-model FILE`: each round's replays of a
`compare` run, simulated on the trace they sent, beside what they measured.

For every recorded replay (live/rounds.py: round, flavour, its records and
sent trace) the simulator runs the same trace on the calibrated cost model,
with the scheduler and settings that server had (settings.py) and the API
overhead added (overhead.py). The cost model's pool and context window are
set to the run's (`compare --num-blocks`, block size, `--max-model-len`),
since those are what ran; the report says so when they differed. Where
compare probed the machine's speed beside its replays, they are predicted on
the cost model scaled by the speed those probes measured together
(calibration/speed_probe.py), and also as calibrated, for comparison. Where
compare recorded every step the server ran (`--step-log`), each replay is
also predicted at the speed of its own steps (step_speed.py): what is left
of that error is the simulator's schedule, not the step model. The
report (tables.py) goes to RUN_DIR/predict/ (`--out`), with every turn
measured beside predicted in turns.csv (turns.py), and to docs/results with
`--publish`.
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm import tqdm

from continuum_lab.calibration.speed_probe import replay_speed, run_speed, scaled
from continuum_lab.live.rounds import RoundRecord, load_rounds
from continuum_lab.prediction.overhead import as_client_saw, engine_trace
from continuum_lab.prediction.settings import describe, sim_policy
from continuum_lab.prediction.step_speed import replay_steps, speed_of, summarize_steps
from continuum_lab.prediction.tables import (
    Pair, diagnosis_table, outcome_table, speed_table, steps_table, summary_lines)
from continuum_lab.prediction.turns import write_turns
from continuum_lab.publish import emit_report
from continuum_lab.report import write_runs
from continuum_lab.results import RunResult
from continuum_lab.sim.cost_model import CostModel, load_cost_model

# compare's setup key -> the cost model's field
RUN_SHAPE = {"num_blocks": "num_gpu_blocks", "block_size": "block_size", "max_model_len": "max_model_len"}


def cost_model_for_run(cost: CostModel, setup: dict) -> tuple[CostModel, list[str]]:
    """The cost model with the run's pool and window, and what was changed."""
    update = {field: setup[key] for key, field in RUN_SHAPE.items()
              if key in setup and getattr(cost, field) != setup[key]}
    notes = [f"cost model's {field} {getattr(cost, field)} -> {value} (the run's)"
             for field, value in update.items()]
    return cost.model_copy(update=update), notes


def _calibrated_load(cost: CostModel) -> str:
    """The machine's load while it was calibrated, to read each replay's beside."""
    load = (cost.calibration or {}).get("load_average_before_after")
    return f"; calibrated at a load average of {load[0]}-{load[1]}" if load else ""


def _run_setup(run_dir: Path) -> tuple[dict, list[RoundRecord]]:
    """compare's setup and its recorded replays; a clear exit where they are missing."""
    results = run_dir / "results.json"
    if not results.is_file():
        raise SystemExit(f"{run_dir} has no results.json: give the --out directory of a compare run")
    try:
        records = load_rounds(run_dir)
    except FileNotFoundError as exc:
        raise SystemExit(str(exc)) from exc
    if not records:
        raise SystemExit(f"{run_dir / 'rounds'} holds no replay: did the compare run end before its "
                         "first replay was saved? Run compare again")
    return json.loads(results.read_text()).get("setup", {}), records


def simulate_replays(records: list[RoundRecord], cost: CostModel, run_dir: Path,
                     out_dir: Path) -> tuple[list[Pair], list[str]]:
    """Each replay simulated on its sent trace, paired with what it measured; the notes
    on how each simulated server differs from the live one. Where compare probed
    the machine's speed (calibration/speed_probe.py), each replay is simulated
    twice: on the cost model as calibrated, and scaled by the run's speed (its
    replays' probes together), which is the prediction the tables give."""
    from continuum_lab.sim.run import prepare_profile, simulate

    fallback_profile = prepare_profile(cost, out_dir)
    pairs: list[Pair] = []
    notes: list[str] = []

    def run_on(model: CostModel, rec: RoundRecord, policy: str, settings: dict) -> RunResult:
        sim, _ = simulate(engine_trace(rec.sent, model.api_overhead_s), model, policy, fallback_profile,
                          extra_settings=settings, progress=False)
        sim.label = rec.label
        sim.meta["round"] = rec.round
        return as_client_saw(sim, model.api_overhead_s)

    speeds = [replay_speed(rec.run.meta, cost) for rec in records]
    factor = run_speed(speeds)
    if factor is None:
        notes.append("no speed probe recorded (or the cost model is not linear): predicted on the "
                     "cost model as calibrated")
    at_speed = cost if factor is None else scaled(cost, factor)
    for rec, speed in zip(tqdm(records, desc="predict", unit="replay"), speeds):
        policy, settings, why = sim_policy(rec.run, run_dir)
        predicted = run_on(at_speed, rec, policy, settings)
        predicted.meta["speed"] = {**(speed or {}), "run": factor}
        as_calibrated = None if factor is None else run_on(cost, rec, policy, settings)
        at_steps = None
        if steps := replay_steps(rec.run.meta, run_dir):
            own = summarize_steps(steps, cost)
            at_steps = run_on(scaled(cost, speed_of(own["all"])), rec, policy, settings)
            at_steps.meta["live_steps"] = own
        pairs.append(Pair(rec.round, rec.label, describe(policy, settings), rec.run, predicted,
                          as_calibrated, at_steps))
        notes += why
    return pairs, notes


def run_predict(run_dir: Path, cost_model: str, *, out_dir: Path | None = None,
                publish: str | None = None, command: str = "") -> int:
    run_dir = Path(run_dir)
    setup, records = _run_setup(run_dir)
    cost, notes = cost_model_for_run(load_cost_model(cost_model), setup)
    out_dir = Path(out_dir or run_dir / "predict")
    out_dir.mkdir(parents=True, exist_ok=True)
    pairs, why = simulate_replays(records, cost, run_dir, out_dir)
    notes += why
    write_runs([q.predicted for q in pairs], out_dir, extra={"setup": {"run_dir": str(run_dir),
               "cost_model": cost.model_dump(), "command": command}})
    turns = write_turns(pairs, out_dir / "turns.csv")
    overhead = cost.api_overhead_s
    lines = [
        f"## Predicted (simulator, cost model {cost.name}) beside measured ({run_dir})", "",
        f"workload {setup.get('workload')}, hints {setup.get('hints')}, pool {cost.num_gpu_blocks} blocks of "
        f"{cost.block_size}; API overhead added per request: {overhead * 1000:.0f} ms"
        + ("" if overhead else " (the cost model has none: not calibrated by `calibrate`)")
        + _calibrated_load(cost),
        "", outcome_table(pairs), "",
        *(["The machine's speed beside each replay (compare's speed probe), and what it changes:", "",
           speeds, ""] if (speeds := speed_table(pairs)) else []),
        *(["Every step the server ran (compare --step-log) beside the simulator's, and the "
           "prediction at the speed of the replay's own steps:", "", steps, ""]
          if (steps := steps_table(pairs)) else []),
        "Where they differ:", "", diagnosis_table(pairs), "",
        *summary_lines(pairs),
    ]
    if notes:
        lines += ["", *[f"- {n}" for n in dict.fromkeys(notes)]]
    lines += ["", f"every turn, measured beside predicted: {turns}",
              f"cost model: {cost.headline or cost.name}",
              f"reproduce: {command or 'vllm-continuum predict'}"]
    emit_report(lines, out_dir, publish, command)
    return 0
