"""`vllm-continuum overhead`: what the continuum hooks cost per engine step.

Both schedulers (vLLM's `Scheduler` and our `ContinuumScheduler` under the
`continuum` policy) run the same simulated trace, and the wall time of
`schedule()` + `update_from_output()` is measured around each step (the
synthetic model output is built outside the timed region). Runs alternate
(stock, continuum, stock, ...) so that a noisy machine weighs on both alike;
the figure reported is, per scheduler, the median over repeats of the mean
(and of the p99) per step, and their ratio.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from vllm_continuum.bench.workload import load_trace
from vllm_continuum.sim.cost_model import load_cost_model
from vllm_continuum.sim.run import prepare_profile, simulate


def run_overhead(
    workload: str = "swebench",
    cost_model: str = "h100-llama3.1-8b",
    *,
    num_programs: int | None = 30,
    rate: float | None = None,
    seed: int | None = None,
    repeats: int = 3,
    out_dir: Path = Path("runs/overhead"),
    policies: tuple[str, str] = ("stock", "continuum"),
    command: str = "",
) -> int:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cost = load_cost_model(cost_model)
    profile_path = prepare_profile(cost, out_dir)
    trace = load_trace(workload, num_programs=num_programs or 30, arrival_rate=rate, seed=seed)
    per: dict[str, dict[str, list[float]]] = {p: {"mean": [], "p99": [], "steps": []} for p in policies}
    for i in range(repeats):
        for policy in policies:
            _, sim = simulate(trace, cost, policy, profile_path, time_scheduler=True,
                              desc=f"overhead {policy} {i + 1}/{repeats}")
            walls = np.array(sim.stats.scheduler_wall_s) * 1e6
            per[policy]["mean"].append(float(walls.mean()))
            per[policy]["p99"].append(float(np.percentile(walls, 99)))
            per[policy]["steps"].append(len(walls))
    base, ours = policies
    rows = {p: {k: statistics.median(v) for k, v in d.items()} for p, d in per.items()}
    lines = [
        f"schedule() + update_from_output() per step, {workload}, {len(trace)} programs, "
        f"cost model {cost.name}, median of {repeats} alternating runs",
        "",
        "| scheduler | steps | mean us/step | p99 us/step |",
        "|---|---|---|---|",
    ]
    for p in policies:
        lines.append(f"| {p} | {rows[p]['steps']:.0f} | {rows[p]['mean']:.1f} | {rows[p]['p99']:.1f} |")
    ratio_mean = rows[ours]["mean"] / rows[base]["mean"]
    ratio_p99 = rows[ours]["p99"] / rows[base]["p99"]
    lines += ["", f"ratio {ours} / {base}: mean {ratio_mean:.3f}x, p99 {ratio_p99:.3f}x",
              "per-run means (us): " + "; ".join(
                  f"{p} " + ", ".join(f"{m:.1f}" for m in per[p]["mean"]) for p in policies),
              f"reproduce: {command or 'vllm-continuum overhead'}"]
    report = "\n".join(lines)
    (out_dir / "report.md").write_text(report + "\n")
    (out_dir / "results.json").write_text(json.dumps(
        {"per_run": per, "median": rows, "ratio_mean": ratio_mean, "ratio_p99": ratio_p99,
         "command": command}, indent=1))
    print(report)
    return 0
