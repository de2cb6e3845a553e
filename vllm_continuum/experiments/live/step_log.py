"""Every engine step of a live server, timed, beside the cost model's time
for the same batch.

`predict` finds the simulator fast, and faster the more a flavour
re-prefills (docs/benchmarks.md, "Mixed steps, preemptions and the
engine's own steps"). Two explanations remain: the live engine's steps take
longer than the cost model says for what they hold, or it runs other steps
(other batches) than the simulator. A step log tells them apart. With
`compare --step-log`, each server runs its scheduler (vLLM's own for stock,
continuum's otherwise) as a subclass that only records (step_recorder.py), after each step,
what the step held, (new tokens, tokens already computed) per request, with
the time from `schedule()` to the end of `update_from_output()` and the time
to the next `schedule()` while requests remained (the whole cycle: the
engine core's own work between steps included). It decides nothing; the
file is named by `--additional-config`'s `step_log`. The CPU build of vLLM
schedules synchronously (vllm/platforms/cpu.py), so one step's schedule and
update bracket its forward pass; under async scheduling they would not.

`summarize_steps` reads a log against a cost model: per kind of step
(decode only, prefill only, mixed), the count, the time measured and
modelled, and their ratio.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path

from vllm_continuum.experiments.sim.cost_model import CostModel

STEP_LOG_KEY = "step_log"  # --additional-config's key: the file to record to


# `--scheduler-cls` of a server that records, by server kind (step_recorder.py).
RECORDERS = {
    "stock": "vllm_continuum.experiments.live.step_recorder.StockStepRecorder",
    "continuum": "vllm_continuum.experiments.live.step_recorder.ContinuumStepRecorder",
}


def read_steps(path: Path, start: float = float("-inf"), end: float = float("inf")) -> list[dict]:
    """The steps begun within [start, end] (perf_counter seconds, system-wide on Linux)."""
    steps = []
    for line in Path(path).read_text().splitlines():
        step = json.loads(line)
        if start <= step["t"] <= end and "step_s" in step:
            steps.append(step)
    return steps


def step_kind(batch: Iterable[list[int]]) -> str:
    decodes = prefills = 0
    for n, computed in batch:
        if n == 1 and computed > 0:
            decodes += 1
        else:
            prefills += 1
    return "mixed" if decodes and prefills else ("decode" if decodes else "prefill")


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
