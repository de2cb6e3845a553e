"""How fast the engine ran a replay's own steps, against a cost model.

`compare --step-log` records every step a server ran (continuum_lab/step_log.py).
Each step's batch has a time in the cost model; the replay's steps, measured
over modelled, are the speed the machine ran at *during* the replay, where the
speed probe (calibration/speed_probe.py) measures it just before and after.
The two differ when the machine's load changes within a replay. Simulated at
that speed, what is left of the error is the simulator's schedule (which
steps it runs), not the step model's time; the number of steps and their
modelled time, live and simulated, show that directly.
"""

from __future__ import annotations

from pathlib import Path

from continuum_lab.sim.cost_model import CostModel, StepFeatures
from continuum_lab.step_log import read_steps


def step_kind(batch: list[list[int]]) -> str:
    """"decode" (only decodes), "prefill" (no decode) or "mixed": a decode as the
    cost model counts one (StepFeatures)."""
    decodes = StepFeatures.of(batch).decodes
    return "mixed" if 0 < decodes < len(batch) else ("decode" if decodes else "prefill")


def summarize_steps(steps: list[dict], cost: CostModel) -> dict[str, dict]:
    """Per kind of step (step_kind) and over "all": how many, and their measured
    and modelled seconds (each step timed on the cost model once)."""
    totals: dict[str, dict] = {}
    for step in steps:
        modelled = cost.step_time([tuple(r) for r in step["batch"]])
        for kind in (step_kind(step["batch"]), "all"):
            t = totals.setdefault(kind, {"steps": 0, "measured_s": 0.0, "modelled_s": 0.0})
            t["steps"] += 1
            t["measured_s"] += step["step_s"]
            t["modelled_s"] += modelled
    return totals


def speed_of(*kinds: dict | None) -> float:
    """Measured over modelled time of these kinds of step (summarize_steps' entries,
    None for a kind the replay had none of) together: the speed the machine ran them at."""
    kinds = [k for k in kinds if k]
    modelled = sum(k["modelled_s"] for k in kinds)
    return sum(k["measured_s"] for k in kinds) / modelled if modelled else float("nan")


def replay_steps(meta: dict, run_dir: Path) -> list[dict] | None:
    """One replay's steps (its step log within the replay's window, not the speed
    probes'), or None where compare recorded none."""
    log = meta.get("step_log")
    if not log or not (path := Path(run_dir) / log["path"]).is_file():
        return None
    return read_steps(path, *log["window"]) or None
