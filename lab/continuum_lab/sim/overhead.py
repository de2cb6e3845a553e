"""`vllm-continuum overhead`: what the continuum hooks cost per engine step.

Both schedulers (vLLM's `Scheduler` and our `ContinuumScheduler` under a
policy label of `sim`: `default`, what ships, unless told) run the same
simulated trace, and `schedule()` +
`update_from_output()` are timed around each step (the synthetic model
output is built outside the timed region), as wall time and as this
thread's CPU time (`time.thread_time`: on a machine shared with other
processes, time spent descheduled is not counted). A warm-up run of each
is discarded; then runs alternate (stock, continuum, stock, ...) so that a
drift in the machine's load weighs on both alike. Reported: per scheduler,
the median over repeats of the mean and of the p99 per step; and the median
of the per-pair ratios (continuum run i / stock run i).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from continuum_lab.publish import emit_report
from continuum_lab.sim.cost_model import load_cost_model
from continuum_lab.sim.run import prepare_profile, simulate
from continuum_lab.workload_spec import load_trace

METRICS = ("wall_mean", "wall_p99", "cpu_mean", "cpu_p99")


def run_overhead(
    workload: str = "swebench",
    cost_model: str = "h100-llama3.1-8b",
    *,
    num_programs: int | None = 30,
    rate: float | None = None,
    seed: int | None = None,
    repeats: int = 5,
    out_dir: Path = Path("runs/overhead"),
    policies: tuple[str, str] = ("stock", "default"),
    command: str = "",
    publish: str | None = None,
) -> int:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cost = load_cost_model(cost_model)
    profile_path = prepare_profile(cost, out_dir)
    trace = load_trace(workload, num_programs=num_programs or 30, arrival_rate=rate, seed=seed)
    warmup = load_trace(workload, num_programs=3, arrival_rate=rate, seed=seed)
    for policy in policies:
        simulate(warmup, cost, policy, profile_path, progress=False, time_scheduler=True)
    per: dict[str, dict[str, list[float]]] = {p: {m: [] for m in (*METRICS, "steps")} for p in policies}
    for i in range(repeats):
        for policy in policies:
            _, sim = simulate(trace, cost, policy, profile_path, time_scheduler=True,
                              desc=f"overhead {policy} {i + 1}/{repeats}")
            wall = np.array(sim.stats.scheduler_wall_s) * 1e6
            cpu = np.array(sim.stats.scheduler_cpu_s) * 1e6
            per[policy]["wall_mean"].append(float(wall.mean()))
            per[policy]["wall_p99"].append(float(np.percentile(wall, 99)))
            per[policy]["cpu_mean"].append(float(cpu.mean()))
            per[policy]["cpu_p99"].append(float(np.percentile(cpu, 99)))
            per[policy]["steps"].append(len(wall))
    base, ours = policies
    med = {p: {k: statistics.median(v) for k, v in d.items()} for p, d in per.items()}
    ratios = {m: statistics.median(o / b for o, b in zip(per[ours][m], per[base][m])) for m in METRICS}
    lines = [
        (f"schedule() + update_from_output() per step: {workload}, {len(trace.agents)} programs, "
         f"cost model {cost.name}; median of {repeats} alternating runs after a warm-up"),
        "",
        "| scheduler | steps | mean us/step (wall) | p99 us/step (wall) | mean us/step (CPU) | p99 us/step (CPU) |",
        "|---|---|---|---|---|---|",
    ]
    for p in policies:
        m = med[p]
        lines.append(f"| {p} | {m['steps']:.0f} | {m['wall_mean']:.1f} | {m['wall_p99']:.1f} | "
                     f"{m['cpu_mean']:.1f} | {m['cpu_p99']:.1f} |")
    lines += [
        "",
        f"ratio {ours} / {base} (median of per-pair ratios): "
        + ", ".join(f"{m.replace('_', ' ')} {r:.3f}x" for m, r in ratios.items()),
        "per-run CPU means (us): " + "; ".join(
            f"{p} " + ", ".join(f"{v:.1f}" for v in per[p]["cpu_mean"]) for p in policies),
        f"reproduce: {command or 'vllm-continuum overhead'}",
    ]
    (out_dir / "results.json").write_text(json.dumps(
        {"per_run": per, "median": med, "ratios": ratios, "command": command}, indent=1))
    emit_report(lines, out_dir, publish, command)
    return 0
