"""`vllm-continuum sim`: the paper-scale simulation, per policy and over a sweep
of arrival rates, with tables, JSON and plots.

Every policy runs the same trace through the real scheduler class (policies.py)
on the same cost model and KV pool. The `continuum` policies get
the prefill profile that `vllm-continuum profile` would fit on the modelled
server (the cost model's own cold prefills). Deterministic under the seed:
the simulated clock drives everything.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from continuum_lab.publish import emit_report
from continuum_lab.report import COLUMNS as REPORT_COLUMNS
from continuum_lab.report import (
    has_one_shot,
    markdown_table,
    plot_runs,
    ratio,
    save_figure,
    summarize,
    write_runs,
)
from continuum_lab.outcomes import outcome, outcome_table
from continuum_lab.results import RunResult
from continuum_lab.sim.cost_model import CostModel, load_cost_model
from continuum_lab.sim.loop import Simulation
from continuum_lab.sim.oracle import HINDSIGHT_PASSES, Hindsight
from continuum_lab.trace_format import Trace
from continuum_lab.workload_spec import load_trace, trace_for_run

DEFAULT_SWEEP = (0.02, 0.04, 0.06, 0.08, 0.10, 0.13)

# The replay benchmark's columns, with runs labelled by policy and coarser tokens/s.
SIM_COLUMNS = [
    ("label", "policy", "{}"),
    *REPORT_COLUMNS[1:-1],
    ("throughput_tokens_per_s", "tokens/s", "{:.0f}"),
]


def prepare_profile(cost: CostModel, out_dir: Path) -> Path:
    profile = cost.prefill_profile()
    path = out_dir / "prefill_profile.yaml"
    profile.save(path)
    return path


def prepare_run(
    out_dir: Path | str, cost_model: str, workload: str, *, num_blocks: int | None = None,
    **trace_options
) -> tuple[Path, CostModel, Path, Trace]:
    """What every simulation command starts from: its output directory, the
    cost model (its KV pool replaced by `num_blocks`, if given: the same server
    with another pool, as `compare --num-blocks` starts it), the prefill
    profile fitted on it, and the trace it replays."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cost = load_cost_model(cost_model).with_pool(num_blocks)
    profile_path = prepare_profile(cost, out_dir)
    return out_dir, cost, profile_path, trace_for_run(workload, out_dir, **trace_options)


def simulate(
    trace: Trace,
    cost: CostModel,
    policy: str,
    profile_path: Path | None,
    *,
    seed: int = 0,
    progress: bool = True,
    time_scheduler: bool = False,
    extra_settings: dict[str, str] | None = None,
    desc: str = "",
    instances: int = 1,
    routing: str | None = None,
    routing_options: dict | None = None,
) -> tuple[RunResult, Simulation]:
    """One policy on one trace. extra_settings: CONTINUUM_* fields (without the
    prefix) for the continuum schedulers, e.g. {"COLD_START_SAMPLES": "20"};
    instances, routing: that many engines behind that router (routing.py).
    `oracle-hindsight*`: the best of up to HINDSIGHT_PASSES oracle runs, each
    knowing what the run before it saw (oracle.py)."""
    total = sum(len(p.turns) for p in trace)
    hindsight = Hindsight()
    runs: list[tuple[RunResult, Simulation]] = []
    for _ in range(HINDSIGHT_PASSES if policy.startswith("oracle-hindsight") else 1):
        with tqdm(total=total, desc=desc or f"sim {policy}", unit="turn", disable=not progress,
                  leave=False) as bar:
            sim = Simulation(
                trace, cost, policy, seed=seed,
                prefill_profile_path=str(profile_path) if profile_path else None,
                extra_settings=extra_settings, time_scheduler=time_scheduler, progress=bar,
                instances=instances, routing=routing, routing_options=routing_options,
                hindsight=hindsight,
            )
            runs.append((sim.run(), sim))
        released = set().union(*(r.turns for r in sim.pressure_releases))
        hindsight = hindsight.after(released, sim.admission_waits)
    if len(runs) == 1:
        return runs[0]
    return min(runs, key=lambda run: summarize(run[0])["jct_mean_s"])  # first of equals


def _one_shot_title(trace: Trace) -> str:
    chat = trace.one_shots
    return f"{len(chat)} one-shot requests at {trace.meta.get('one_shot_rate')} /s, " if chat else ""


def _oracle_ratio(summaries: list[dict]) -> str:
    oracle = next((s for s in summaries if s["label"] == "oracle"), None)
    if oracle is None:
        return ""
    lines = ["", "| policy | mean JCT / oracle's | p95 JCT / oracle's |", "|---|---|---|"]
    for s in summaries:
        lines.append(f"| {s['label']} | {s['jct_mean_s'] / oracle['jct_mean_s']:.3f}x | "
                     f"{s['jct_p95_s'] / oracle['jct_p95_s']:.3f}x |")
    return "\n".join(lines)


def pin_lines(runs: Sequence[RunResult]) -> list[str]:
    lines = []
    for r in runs:
        cs = r.meta.get("continuum_stats")
        extra = (f"steps {r.meta['steps']}, preemptions {r.meta['preemptions']}, KV pool used "
                 f"{r.meta['pool_usage_mean']:.0%} on average (max {r.meta['pool_usage_max']:.0%})")
        if cs:
            pins = sum(cs["pins_by_tool"].values())
            extra += (f", pins {pins}, releases {cs['releases_by_reason']}, "
                      f"resumes {cs['resumes_by_outcome']}, refused by cap {cs['pins_refused_by_cap']}")
        lines.append(f"{r.label}: {extra}")
    return lines


def sweep_points(
    workload: str, cost: CostModel, profile_path: Path, policies: Sequence[str], over: str,
    values: Sequence[float], *, num_programs: int | None, rate: float | None, seed: int | None,
    settings: dict[str, str] | None = None,
) -> tuple[str, list[dict]]:
    """Every policy at each value of `over` ("rate": arrival rates; "seed": workload
    seeds, i.e. independent traces of the same spec, to tell a policy's effect
    from one trace's luck). Returns the table and its rows."""
    rows: list[dict] = []
    for value in tqdm(values, desc=f"sweep {over}", unit=over):
        point = {"arrival_rate": rate, "seed": seed}
        point["arrival_rate" if over == "rate" else "seed"] = value
        trace = load_trace(workload, num_programs=num_programs, **point)
        at_point: list[tuple[RunResult, dict]] = []
        for policy in policies:
            run, _ = simulate(trace, cost, policy, profile_path, desc=f"{over} {value} {policy}",
                              extra_settings=settings)
            at_point.append((run, {over: value, **summarize(run),
                                   "pool_usage_mean": run.meta["pool_usage_mean"],
                                   "pool_usage_max": run.meta["pool_usage_max"]}))
        stock = next((run for run, _ in at_point if run.label == "stock"), None)
        for run, row in at_point:
            rows.append({**row, **(outcome(run, stock) if stock is not None else {}),
                         "label": run.label})
    base = {r[over]: r for r in rows if r["label"] == "stock"}
    oracle = {r[over]: r for r in rows if r["label"] == "oracle"}
    one_shot = has_one_shot(rows)
    head = [f"{over}" + (" /s" if over == "rate" else ""), "policy", "mean JCT s", "p95 JCT s",
            "programs/min", "reuse of prev prompt", "KV pool used mean / max"]
    if one_shot:
        head += ["one-shot p99 TTFT s"]
    if base:
        head += ["stock / mean JCT", "stock / p95 JCT"]
        head += ["one-shot p99 TTFT / stock's"] if one_shot else []
    if oracle:
        head += ["mean JCT / oracle"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r[over]:.3g}", r["label"], f"{r['jct_mean_s']:.2f}", f"{r['jct_p95_s']:.2f}",
                 f"{r['throughput_programs_per_min']:.2f}", f"{r['reuse_of_prev_prompt']:.1%}",
                 f"{r['pool_usage_mean']:.0%} / {r['pool_usage_max']:.0%}"]
        if one_shot:
            cells += [f"{r['one_shot_ttft_p99_s']:.3f}"]
        if base:
            b = base[r[over]]
            cells += [ratio(b["jct_mean_s"], r["jct_mean_s"]), ratio(b["jct_p95_s"], r["jct_p95_s"])]
            if one_shot:
                cells += [ratio(r["one_shot_ttft_p99_s"], b["one_shot_ttft_p99_s"])]
        if oracle:
            cells += [f"{r['jct_mean_s'] / oracle[r[over]]['jct_mean_s']:.3f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    if over == "seed":
        lines += ["", *seed_summary(rows)]
    return "\n".join(lines), rows


def _by_seed(rows: list[dict], key: str) -> tuple[list, list[str], dict]:
    """Seeds, policies, and each row's `key` by (seed, policy)."""
    rows = [r for r in rows if "seed" in r]
    seeds = sorted({r["seed"] for r in rows})
    policies = list(dict.fromkeys(r["label"] for r in rows))
    return seeds, policies, {(r["seed"], r["label"]): r[key] for r in rows}


def _stock_ratios(rows: list[dict], key: str = "jct_mean_s",
                  over_stock: bool = False) -> dict[str, list[float]]:
    """Each policy's ratio to stock per seed on `key` (empty without stock): stock's
    over the policy's (a gain is above 1x), or with over_stock the policy's over
    stock's (a cost is above 1x)."""
    seeds, policies, value = _by_seed(rows, key)
    if "stock" not in policies:
        return {p: [] for p in policies}
    pairs = {p: [(value[(s, p)], value[(s, "stock")]) for s in seeds] for p in policies}
    return {p: [a / b if over_stock else b / a for a, b in ps] for p, ps in pairs.items()}


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _spread(xs: list[float]) -> list[str]:
    """Geometric mean, min, max: three table cells."""
    lo, hi = (min(xs), max(xs)) if xs else (float("nan"),) * 2
    return [f"{_geomean(xs):.3f}x", f"{lo:.2f}x", f"{hi:.2f}x"]


def seed_summary(rows: list[dict]) -> list[str]:
    """Per policy over seeds: geometric mean, min and max of stock's mean JCT over
    the policy's, and in how many seeds the policy had the lowest mean JCT (ties count
    for every policy tied); with one-shot traffic, the same spread of the policy's
    one-shot p99 TTFT over stock's."""
    seeds, policies, jct = _by_seed(rows, "jct_mean_s")
    ratios = _stock_ratios(rows)
    one_shot = _stock_ratios(rows, "one_shot_ttft_p99_s", over_stock=True) if has_one_shot(rows) else None
    best = {s: min(jct[(s, p)] for p in policies) for s in seeds}
    outcomes = bool(rows) and "worst_program_ratio" in rows[0]  # rows of runs against stock
    head = ["policy", "stock / mean JCT, geometric mean", "min", "max", "lowest mean JCT in"]
    if outcomes:
        makespan = _stock_ratios(rows, "makespan_s")
        head += ["stock makespan / makespan, geometric mean"]
        head += ["programs >10% slower than on stock, worst seed", "worst program JCT / stock's"]
    if one_shot:
        head += ["one-shot p99 TTFT / stock's, geometric mean", "min", "max"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in policies:
        wins = sum(jct[(s, p)] <= best[s] * (1 + 1e-9) for s in seeds)
        cells = [p, *_spread(ratios[p]), f"{wins} of {len(seeds)} seeds"]
        if outcomes:
            mine = [r for r in rows if r["label"] == p and "seed" in r]
            cells += [f"{_geomean(makespan[p]):.3f}x",
                      f"{max(r['programs_slower_10pct'] for r in mine):.0%}",
                      f"{max(r['worst_program_ratio'] for r in mine):.2f}x"]
        if one_shot:
            cells += _spread(one_shot[p])
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _plot_sweep(rows: list[dict], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    policies = list(dict.fromkeys(r["label"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for policy in policies:
        pts = sorted((r["rate"], r["jct_mean_s"], r["jct_p95_s"]) for r in rows if r["label"] == policy)
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
        axes[1].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=policy)
    for ax, what in zip(axes, ("mean", "p95")):
        ax.set_xlabel("arrival rate (programs/s)")
        ax.set_ylabel(f"{what} JCT (s)")
        ax.grid(alpha=0.3)
        ax.legend()
    save_figure(fig, out_dir / "sweep_jct.png")


def plot_seeds(rows: list[dict], out_dir: Path, title: str = "") -> Path:
    """Stock's mean JCT over each policy's, per seed (dots) and their geometric
    mean (bar): how much of a policy's gain is the policy, how much the trace."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    ratios = _stock_ratios(rows)
    policies = [p for p in ratios if p != "stock"]
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(policies), 4))
    for i, policy in enumerate(policies):
        color = "C0" if "hold" in policy else "C1" if "yield" in policy else "C7"
        ax.bar(i, _geomean(ratios[policy]), color=color, alpha=0.45)
        ax.scatter([i] * len(ratios[policy]), ratios[policy], color="black", s=12, zorder=3)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_xticks(range(len(policies)), policies, rotation=20)
    ax.set_ylabel("stock mean JCT / policy's")
    ax.set_title(f"per seed (dots), geometric mean (bars) {title}".strip(), fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, out_dir / "seeds_ratio.png")


def run_sim(
    workload: str = "swebench",
    cost_model: str = "h100-llama3.1-8b",
    out_dir: Path = Path("runs/sim"),
    *,
    policies: Sequence[str] = ("stock", "continuum", "oracle"),
    num_programs: int | None = None,
    rate: float | None = None,
    seed: int | None = None,
    sweep: Sequence[float] | None = None,
    sweep_programs: int | None = None,
    seeds: Sequence[int] | None = None,
    settings: dict[str, str] | None = None,
    num_blocks: int | None = None,
    command: str = "",
    publish: str | None = None,
) -> int:
    started = time.perf_counter()
    out_dir, cost, profile_path, trace = prepare_run(
        out_dir, cost_model, workload, num_blocks=num_blocks, num_programs=num_programs,
        arrival_rate=rate, seed=seed
    )
    setup = {
        "command": command,
        "workload": workload,
        "trace": trace.summary(),
        "cost_model": cost.model_dump(),
        "prefill_profile": str(profile_path),
        "policies": list(policies),
        "settings": settings or {},
    }
    print(f"workload {workload}: {json.dumps(trace.summary())}")
    print(f"cost model {cost.name}: KV pool {cost.num_gpu_blocks} blocks of {cost.block_size} "
          f"({cost.pool_tokens} tokens); cold prefill 10k tokens {cost.prefill_seconds(10000):.3f} s")
    runs: list[RunResult] = []
    walls: dict[str, float] = {}
    for policy in tqdm(policies, desc="policies", unit="policy"):
        t0 = time.perf_counter()
        run, _ = simulate(trace, cost, policy, profile_path, extra_settings=settings)
        walls[policy] = time.perf_counter() - t0
        runs.append(run)
    summaries = [summarize(r) for r in runs]
    table = markdown_table(summaries, baseline="stock" if "stock" in policies else None,
                           columns=SIM_COLUMNS)
    title = (f"## {workload}, {len(trace.agents)} programs, rate {trace.meta.get('arrival_rate')} /s, "
             f"{_one_shot_title(trace)}cost model {cost.name}")
    text = [title, "", table, _oracle_ratio(summaries), ""]
    if "stock" in policies:
        text += [outcome_table(runs, "stock"), ""]
    text += pin_lines(runs)
    sweep_rows: list[dict] = []
    if sweep is not None:
        rates = list(sweep) or list(DEFAULT_SWEEP)
        sweep_table, sweep_rows = sweep_points(
            workload, cost, profile_path, policies, "rate", rates,
            num_programs=sweep_programs or num_programs, rate=rate, seed=seed, settings=settings,
        )
        _plot_sweep(sweep_rows, out_dir / "plots")
        text += ["", f"## sweep over arrival rate ({workload}, cost model {cost.name})", "", sweep_table]
    if seeds:
        seed_table, seed_rows = sweep_points(
            workload, cost, profile_path, policies, "seed", seeds,
            num_programs=sweep_programs or num_programs, rate=rate, seed=seed, settings=settings,
        )
        sweep_rows += seed_rows
        plot_seeds(seed_rows, out_dir / "plots", title=f"({workload}, {cost.name})")
        text += ["", f"## over workload seeds ({workload}, rate {trace.meta.get('arrival_rate')} /s, "
                 f"cost model {cost.name})", "", seed_table]
    elapsed = time.perf_counter() - started
    text += ["", "wall time per policy: " + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()),
             f"total wall time: {elapsed:.0f} s", f"reproduce: {command or 'vllm-continuum sim'}"]
    setup["wall_s"] = {"per_policy": walls, "total": elapsed}
    write_runs(runs, out_dir, extra={"setup": setup, "sweep": sweep_rows})
    plots = plot_runs(runs, out_dir / "plots", title=f"({workload}, sim)")
    emit_report(text, out_dir, publish, command)
    print(f"results: {out_dir / 'results.json'}; plots: {', '.join(str(p) for p in plots)}")
    return 0
