"""`vllm-continuum sim --instances N --routing ...`: N engines behind each router,
stock vs continuum, on one trace.

A pin pays only where the session's next turn lands, so across instances
the router decides what pinning is worth: this runs every (routing, policy)
pair on the same trace and cost model (each engine a real scheduler, as in
the single-engine simulation) and reports, per pair, the agents' JCT and
reuse of the previous prompt, how evenly the router spread the work (the
busiest instance against the mean, in requests routed and in busy time),
how often a resumed turn came back to the instance of its previous turn,
and, for continuum, how often a resumed turn whose pin was alive reached
the instance holding it (the rest of those pins are held for nothing).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from continuum_lab.publish import emit_report
from continuum_lab.report import plot_runs, ratio, save_figure, summarize, write_runs
from continuum_lab.results import RunResult
from continuum_lab.sim.routing import ROUTINGS
from continuum_lab.sim.run import pin_lines, prepare_run, simulate


def _max_over_mean(values: Sequence[float]) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean else float("nan")


def cluster_row(run: RunResult, routing: str, policy: str) -> dict:
    """The figures of one (routing, policy) run: its summary and the cluster's."""
    c = run.meta["cluster"]
    placed = {(p, k): i for p, k, i in c["placements"]}
    resumed = [(p, k) for p, k in placed if k > 0 and (p, k - 1) in placed]
    same = sum(placed[(p, k)] == placed[(p, k - 1)] for p, k in resumed)
    return {
        **summarize(run),
        "routing": routing,
        "policy": policy,
        "instances": c["instances"],
        "routed_max_over_mean": _max_over_mean(c["routed"]),
        "busy_max_over_mean": _max_over_mean(c["busy_s"]),
        "same_instance_share": same / len(resumed) if resumed else float("nan"),
        "pinned_turns": c["pinned_turns"],
        "reached_pin_share": c["reached_pin"] / c["pinned_turns"] if c["pinned_turns"] else float("nan"),
        "pool_usage_mean": run.meta["pool_usage_mean"],
        "pool_usage_max": run.meta["pool_usage_max"],
        "preemptions": run.meta["preemptions"],
    }


def cluster_table(rows: Sequence[dict]) -> str:
    """One line per (routing, policy); ratios to stock under the same routing and
    to the lowest mean JCT of the table."""
    stock = {r["routing"]: r for r in rows if r["policy"] == "stock"}
    best = min(r["jct_mean_s"] for r in rows)
    head = ["routing", "policy", "mean JCT s", "p95 JCT s", "reuse of prev prompt",
            "next turn on the same instance", "resumed turns reaching their pin",
            "requests routed max / mean", "busy time max / mean", "KV pool used mean / max",
            "preemptions", "stock / mean JCT (same routing)", "mean JCT / best"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        reach = (f"{r['reached_pin_share']:.1%} of {r['pinned_turns']}" if r["pinned_turns"] else "-")
        base = stock.get(r["routing"])
        cells = [r["routing"], r["policy"], f"{r['jct_mean_s']:.2f}", f"{r['jct_p95_s']:.2f}",
                 f"{r['reuse_of_prev_prompt']:.1%}", f"{r['same_instance_share']:.1%}", reach,
                 f"{r['routed_max_over_mean']:.2f}", f"{r['busy_max_over_mean']:.2f}",
                 f"{r['pool_usage_mean']:.0%} / {r['pool_usage_max']:.0%}", str(r["preemptions"]),
                 ratio(base["jct_mean_s"], r["jct_mean_s"]) if base else "",
                 f"{r['jct_mean_s'] / best:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_cluster(rows: Sequence[dict], out_dir: Path, title: str = "") -> Path:
    """Per routing, one bar per policy: mean JCT, stock's mean JCT over the policy's
    (the policy's gain under that router), reuse of the previous prompt, and the
    busiest instance's busy time over the mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    routings = list(dict.fromkeys(r["routing"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    stock = {r["routing"]: r["jct_mean_s"] for r in rows if r["policy"] == "stock"}
    value = {(r["routing"], r["policy"]): {**r, "gain": stock.get(r["routing"], 0.0) / r["jct_mean_s"]}
             for r in rows}
    width = 0.8 / len(policies)
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    panels = (("jct_mean_s", "mean JCT (s)", 1.0), ("gain", "stock mean JCT / policy's", 1.0),
              ("reuse_of_prev_prompt", "reuse of previous prompt (%)", 100.0),
              ("busy_max_over_mean", "busiest instance's busy time / mean", 1.0))
    for ax, (key, ylabel, scale) in zip(axes, panels):
        for j, policy in enumerate(policies):
            xs = [i + (j - (len(policies) - 1) / 2) * width for i in range(len(routings))]
            ys = [value[(rt, policy)][key] * scale if (rt, policy) in value else 0 for rt in routings]
            ax.bar(xs, ys, width, label=policy)
        ax.set_xticks(range(len(routings)), [rt.replace("_", "\n", 1) for rt in routings], fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    for ax in axes[1], axes[3]:
        ax.axhline(1.0, color="grey", lw=1, ls="--")
    axes[0].legend()
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, out_dir / "cluster_routing.png")


def run_cluster(
    workload: str,
    cost_model: str,
    out_dir: Path,
    *,
    instances: int,
    routings: Sequence[str] = ROUTINGS,
    policies: Sequence[str] = ("stock", "continuum"),
    num_programs: int | None = None,
    rate: float | None = None,
    seed: int | None = None,
    settings: dict[str, str] | None = None,
    routing_options: dict | None = None,
    num_blocks: int | None = None,
    command: str = "",
    publish: str | None = None,
) -> int:
    started = time.perf_counter()
    out_dir, cost, profile_path, trace = prepare_run(
        out_dir, cost_model, workload, num_blocks=num_blocks, num_programs=num_programs,
        arrival_rate=rate, seed=seed
    )
    print(f"workload {workload}: {json.dumps(trace.summary())}")
    print(f"{instances} instances of cost model {cost.name}: KV pool {cost.num_gpu_blocks} blocks "
          f"of {cost.block_size} ({cost.pool_tokens} tokens) each")
    runs: list[RunResult] = []
    rows: list[dict] = []
    walls: dict[str, float] = {}
    for routing in tqdm(list(routings), desc="routings", unit="routing"):
        for policy in policies:
            t0 = time.perf_counter()
            run, _ = simulate(trace, cost, policy, profile_path, extra_settings=settings,
                              instances=instances, routing=routing, routing_options=routing_options,
                              desc=f"{routing} {policy}")
            label = f"{routing} {policy}"
            walls[label] = time.perf_counter() - t0
            run.label = label
            runs.append(run)
            rows.append(cluster_row(run, routing, policy))
            r = rows[-1]
            print(f"{label}: mean JCT {r['jct_mean_s']:.2f} s, reuse {r['reuse_of_prev_prompt']:.1%}, "
                  f"KV pool used {r['pool_usage_mean']:.0%} on average, {walls[label]:.0f} s", flush=True)
    title = (f"{workload}, {len(trace.agents)} programs, rate {trace.meta.get('arrival_rate')} /s, "
             f"{instances} instances of cost model {cost.name}")
    text = [f"## {title}", "", cluster_table(rows), ""]
    text += pin_lines(runs)
    elapsed = time.perf_counter() - started
    text += ["", "wall time per run: " + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()),
             f"total wall time: {elapsed:.0f} s", f"reproduce: {command or 'vllm-continuum sim'}"]
    setup = {"command": command, "workload": workload, "trace": trace.summary(),
             "cost_model": cost.model_dump(), "prefill_profile": str(profile_path),
             "instances": instances, "routings": list(routings), "policies": list(policies),
             "routing_options": routing_options or {}, "settings": settings or {},
             "wall_s": {"per_run": walls, "total": elapsed}}
    write_runs(runs, out_dir, extra={"setup": setup, "cluster": rows})
    plots = [plot_cluster(rows, out_dir / "plots", title)]
    plots += plot_runs(runs, out_dir / "plots", title=f"({workload}, {instances} instances)")
    emit_report(text, out_dir, publish, command)
    print(f"results: {out_dir / 'results.json'}; plots: {', '.join(str(p) for p in plots)}")
    return 0
