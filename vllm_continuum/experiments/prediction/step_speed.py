"""How fast the engine ran a replay's own steps, against a cost model.

`compare --step-log` records every step a server ran (experiments/step_log.py).
Each step's batch has a time in the cost model; the replay's steps, measured
over modelled, are the speed the machine ran at *during* the replay, where the
speed probe (calibration/speed_probe.py) measures it just before and after.
The two differ when the machine's load changes within a replay. Simulated at
that speed, what is left of the error is the simulator's schedule (which
steps it runs), not the step model's time; the number of steps and their
modelled time, live and simulated, show that directly.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from vllm_continuum.experiments.sim.cost_model import CostModel
from vllm_continuum.experiments.step_log import read_steps, step_kind


def summarize_steps(steps: list[dict], cost: CostModel) -> dict[str, dict]:
    """Per kind of step and over all: count, measured seconds (step, and cycle
    where the next step followed), modelled seconds, and the median ratio."""
    groups: dict[str, list[dict]] = {}
    for step in steps:
        groups.setdefault(step_kind(step["batch"]), []).append(step)
    groups["all"] = steps
    out = {}
    for kind, group in groups.items():
        modelled = [cost.step_time([tuple(r) for r in s["batch"]]) for s in group]
        measured = [s["step_s"] for s in group]
        cycled = [(s["cycle_s"], m) for s, m in zip(group, modelled) if "cycle_s" in s]
        out[kind] = {
            "steps": len(group),
            "tokens": sum(n for s in group for n, _ in s["batch"]),
            "measured_s": sum(measured),
            "cycle_s": sum(c for c, _ in cycled),
            "modelled_s": sum(modelled),
            "step_over_model_median": statistics.median(a / b for a, b in zip(measured, modelled)) if group else float("nan"),
            "cycle_over_model_median": statistics.median(c / m for c, m in cycled) if cycled else float("nan"),
        }
    return out


def replay_steps(meta: dict, run_dir: Path) -> list[dict] | None:
    """One replay's steps (its step log within the replay's window, not the speed
    probes'), or None where compare recorded none."""
    log = meta.get("step_log")
    if not log or not (path := Path(run_dir) / log["path"]).is_file():
        return None
    return read_steps(path, *log["window"]) or None
