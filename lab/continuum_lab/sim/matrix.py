"""The measurement matrix: every policy on every workload
at several loads over several seeds, one command, a Markdown report and a
heat map.

A cell is a workload on a cost model at one load (an arrival rate chosen to
put the pool under no, moderate or heavy pressure; the report prints the
pool's mean occupancy under stock so the choice can be checked). In each
cell, for each policy, over the seeds:

- gain: geometric mean of stock's mean JCT over the policy's, and the worst
  seed's ratio (the target: >= 0.98x in every cell);
- vs best: the policy's geometric-mean JCT over the best policy's in that
  cell, in hindsight (the target: within 5%);
- vs oracle: the same over `oracle`'s, and over `oracle-hindsight`'s (oracle.py);
- one-shot p99 TTFT and latency over stock's (geometric mean; cells with chat traffic);
- preemptions over all seeds, against stock's;
- outcome against stock program by program (outcomes.py): stock's makespan
  over the policy's (geometric mean), the share of programs more than 10%
  slower than on stock and the worst program's JCT ratio (worst seed).

The `overload` loads put the agents' contexts far beyond the pool:
stock thrashes (reuse of the previous prompt under 20%); there the targets
also ask for a several-fold gain, makespan, and no program slower.

The grid is `continuum_lab/configs/matrix.yaml`; `--quick` runs its quick
subset (one seed, one load per cell) for iteration. `--targets POLICY` adds
the targets checked for that policy, cell by cell; `--from-json`
renders earlier runs' rows again, merged (a policy run later beside them).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from collections.abc import Sequence
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from continuum_lab.configs import CONFIG_DIR, named_yaml
from continuum_lab.outcomes import geomean, outcome, program_outcome
from continuum_lab.publish import publish_report
from continuum_lab.report import save_figure, summarize
from continuum_lab.sim.cost_model import load_cost_model
from continuum_lab.sim.run import prepare_profile, simulate
from continuum_lab.workload_spec import load_trace

MATRIX_FILE = CONFIG_DIR / "matrix.yaml"


class Load(BaseModel):
    """A load with its own number of programs (the overload loads run more)."""

    model_config = ConfigDict(extra="forbid")
    rate: float = Field(gt=0)  # programs/s
    programs: int = Field(ge=1)


class CellSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    workload: str
    cost_model: str
    programs: int = Field(ge=1)
    loads: dict[str, float | Load]  # load name -> arrival rate (programs/s), or a Load
    num_blocks: int | None = Field(None, ge=1)  # the KV pool, instead of the cost model's

    def load(self, name: str) -> Load:
        value = self.loads[name]
        return value if isinstance(value, Load) else Load(rate=value, programs=self.programs)


class MatrixSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seeds: list[int] = Field(min_length=1)
    policies: list[str] = Field(min_length=1)
    cells: list[CellSpec] = Field(min_length=1)
    quick_load: str = "moderate"

    def grid(self, quick: bool, load: str | None = None) -> list[tuple[CellSpec, str, float]]:
        """(cell, load, rate) to run: every load, the quick one, or `load`."""
        only = load or (self.quick_load if quick else None)
        return [(c, name, c.load(name).rate) for c in self.cells for name in c.loads
                if only is None or name == only]


def cell_summary(rows: list[dict]) -> dict[str, dict]:
    """Per policy, the cell's figures from its per-seed rows (see the module's
    docstring). Each row: label, seed, jct_mean_s, one_shot_ttft_p99_s, preemptions."""
    by = {(r["label"], r["seed"]): r for r in rows}
    policies = list(dict.fromkeys(r["label"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    jct = {p: geomean([by[(p, s)]["jct_mean_s"] for s in seeds]) for p in policies}
    best = min(jct.values())
    out: dict[str, dict] = {}
    for p in policies:
        ratios = [by[("stock", s)]["jct_mean_s"] / by[(p, s)]["jct_mean_s"] for s in seeds] \
            if "stock" in policies else []
        one_shot = [by[(p, s)]["one_shot_ttft_p99_s"] / by[("stock", s)]["one_shot_ttft_p99_s"]
                    for s in seeds if "stock" in policies
                    and by[("stock", s)].get("one_shot_ttft_p99_s", 0) > 0]
        out[p] = {
            "jct_mean_s": jct[p],
            "gain": geomean(ratios),
            "worst": min(ratios, default=float("nan")),
            "vs_best": jct[p] / best,
            "vs_oracle": jct[p] / jct["oracle"] if "oracle" in jct else float("nan"),
            "vs_hindsight": (jct[p] / jct["oracle-hindsight"] if "oracle-hindsight" in jct
                             else float("nan")),
            "one_shot_p99_vs_stock": geomean(one_shot),
            "preemptions": sum(by[(p, s)]["preemptions"] for s in seeds),
            # Outcome against stock, program by program (outcomes.py), over the seeds.
            "makespan": geomean([by[(p, s)].get("makespan_ratio", math.nan) for s in seeds]),
            "slower": max((by[(p, s)].get("programs_slower_10pct", math.nan) for s in seeds),
                          default=math.nan),
            "worst_program": max((by[(p, s)].get("worst_program_ratio", math.nan) for s in seeds),
                                 default=math.nan),
            "one_shot_latency_p99_vs_stock": geomean(
                [by[(p, s)].get("one_shot_latency_p99_ratio", math.nan) for s in seeds]),
            "one_shot_latency_mean_vs_stock": geomean(
                [by[(p, s)].get("one_shot_latency_mean_ratio", math.nan) for s in seeds]),
        }
    return out


def _fmt(x: float, spec: str = "{:.2f}x") -> str:
    return spec.format(x) if math.isfinite(x) else "-"


def cell_table(name: str, summary: dict[str, dict], occupancy: float, reuse: float) -> list[str]:
    stock = summary.get("stock", {}).get("preemptions")
    lines = [f"### {name} (stock's KV pool used {occupancy:.0%} on average, "
             f"reuse of the previous prompt {reuse:.0%})", "",
             "| policy | stock / JCT (geo. mean) | worst seed | JCT / best | JCT / oracle "
             "| JCT / oracle-hindsight | stock makespan / makespan | programs >10% slower "
             "(worst seed) | worst program JCT / stock | one-shot p99 TTFT / stock "
             "| one-shot mean latency / stock | one-shot p99 latency / stock | preemptions (stock) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p, s in summary.items():
        lines.append(
            f"| {p} | {_fmt(s['gain'], '{:.3f}x')} | {_fmt(s['worst'])} | "
            f"{_fmt(s['vs_best'], '{:.3f}x')} | {_fmt(s['vs_oracle'], '{:.3f}x')} | "
            f"{_fmt(s.get('vs_hindsight', math.nan), '{:.3f}x')} | "
            f"{_fmt(s.get('makespan', math.nan))} | {_fmt(s.get('slower', math.nan), '{:.0%}')} | "
            f"{_fmt(s.get('worst_program', math.nan))} | "
            f"{_fmt(s['one_shot_p99_vs_stock'])} | "
            f"{_fmt(s.get('one_shot_latency_mean_vs_stock', math.nan))} | "
            f"{_fmt(s.get('one_shot_latency_p99_vs_stock', math.nan))} | "
            f"{s['preemptions']} ({stock}) |"
        )
    return lines


def _at_most(key: str, bound: float):
    """A target on a ratio that may be absent (no one-shot traffic): met if absent."""
    return lambda s, stock: not math.isfinite(s.get(key, math.nan)) or s[key] <= bound


# The targets for the default policy in every cell.
TARGETS = {
    "worst": ("worst seed >= 0.98x stock", lambda s, stock: s["worst"] >= 0.98),
    "vs_best": ("within 5% of the best", lambda s, stock: s["vs_best"] <= 1.05),
    "one_shot": ("one-shot p99 TTFT <= 1.10x stock", _at_most("one_shot_p99_vs_stock", 1.10)),
    "one_shot_latency": ("one-shot p99 latency <= 1.10x stock",
                         _at_most("one_shot_latency_p99_vs_stock", 1.10)),
    "preemptions": ("preemptions <= stock's", lambda s, stock: s["preemptions"] <= stock),
}
# In the overload cells, also (agents alone / beside one-shots).
OVERLOAD_TARGETS = {
    "gain": ("mean JCT >= 3x stock (2x beside one-shots)",
             lambda s, one_shot: s["gain"] >= (2.0 if one_shot else 3.0)),
    "makespan": ("makespan >= 2x stock (agents alone)",
                 lambda s, one_shot: one_shot or s.get("makespan", math.nan) >= 2.0),
    "slower": ("no program > 10% slower than on stock (agents alone)",
               lambda s, one_shot: one_shot or s.get("slower", math.nan) == 0),
}
OVERLOAD = "overload"


def targets_table(cells: dict[str, dict[str, dict]], policy: str) -> list[str]:
    """For `policy`, each cell's figures against the targets (met or missed), and
    which policy was best there."""
    head = ["cell", "stock / JCT", "worst seed", "JCT / best (best)", "one-shot p99 / stock",
            "preemptions (stock)", "targets missed"]
    lines = [f"### Targets for `{policy}`", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for name, summary in cells.items():
        if policy not in summary:
            continue
        s, stock = summary[policy], summary.get("stock", {}).get("preemptions", 0)
        best = min(summary, key=lambda p: summary[p]["vs_best"])
        missed = [label for label, check in TARGETS.values() if not check(s, stock)]
        if f" {OVERLOAD} " in name:
            one_shot = math.isfinite(s["one_shot_p99_vs_stock"])
            missed += [label for label, check in OVERLOAD_TARGETS.values() if not check(s, one_shot)]
        lines.append(
            f"| {name} | {_fmt(s['gain'], '{:.3f}x')} | {_fmt(s['worst'])} | "
            f"{_fmt(s['vs_best'], '{:.3f}x')} ({best}) | {_fmt(s['one_shot_p99_vs_stock'])} | "
            f"{s['preemptions']} ({stock}) | {'; '.join(missed) or 'none'} |"
        )
    return lines


def plot_heatmap(cells: dict[str, dict[str, dict]], out: Path) -> Path:
    """Policy x cell, colour and number: stock's mean JCT over the policy's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(cells)
    policies = list(dict.fromkeys(p for c in cells.values() for p in c))
    grid = [[cells[c].get(p, {}).get("gain", math.nan) for c in names] for p in policies]
    fig, ax = plt.subplots(figsize=(max(6.0, 2.5 + 1.1 * len(names)), 1 + 0.38 * len(policies)))
    image = ax.imshow(grid, cmap="RdYlGn", norm=matplotlib.colors.LogNorm(2 / 3, 1.5), aspect="auto")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(j, i, _fmt(v), ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=7)
    ax.set_yticks(range(len(policies)), policies, fontsize=7)
    fig.colorbar(image, ax=ax, label="stock mean JCT / policy's (geometric mean over seeds)")
    return save_figure(fig, out)


def _cell_seed(cell: CellSpec, load: str, rate: float, seed: int, policies: Sequence[str],
               profiles: dict[str, Path]) -> list[dict]:
    """Every policy on one cell's trace of one seed: the unit of work of `run_matrix`."""
    cost = load_cost_model(cell.cost_model).with_pool(cell.num_blocks)
    profile = profiles[cell.cost_model]
    name = cell_name(cell, load, rate)
    trace = load_trace(cell.workload, num_programs=cell.load(load).programs, arrival_rate=rate,
                       seed=seed)
    runs = [simulate(trace, cost, policy, profile, progress=False)[0] for policy in policies]
    stock = next((r for r in runs if r.label == "stock"), None)
    return [{**summarize(run), **(outcome(run, stock) if stock is not None else {}),
             "label": run.label, "seed": seed, "cell": name,
             "preemptions": run.meta["preemptions"], "pool_usage_mean": run.meta["pool_usage_mean"],
             # per program: a policy run apart from stock is judged against it later
             "program_jct_s": {p.program: p.jct_s for p in run.programs},
             "resume_tokens": run.meta["resume_tokens"],
             **({"host_tier": run.meta["host_tier"]} if "host_tier" in run.meta else {})}
            for run in runs]


def cell_name(cell: CellSpec, load: str, rate: float) -> str:
    programs = cell.load(load).programs
    pool = f", {cell.num_blocks} blocks" if cell.num_blocks is not None else ""
    return f"{cell.workload} {load} ({rate}/s, {programs} programs, {cell.cost_model}{pool})"


def run_matrix(
    spec: MatrixSpec, out_dir: Path, *, quick: bool = False, load: str | None = None,
    policies: Sequence[str] | None = None, command: str = "", jobs: int = 1,
    target_policy: str | None = None, publish: str | None = None, report: str = "matrix",
) -> int:
    """Every (cell, seed) is one task, run in `jobs` processes; the report keeps
    the grid's order whatever order the tasks finish in."""
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    policies = list(policies or spec.policies)
    seeds = spec.seeds[:1] if quick else spec.seeds
    grid = spec.grid(quick, load)
    profiles = {}  # written once, before any task reads them
    for name in sorted({c.cost_model for c, _, _ in grid}):
        where = out_dir / Path(name).stem  # a name, or a cost model's YAML path
        where.mkdir(exist_ok=True)
        profiles[name] = prepare_profile(load_cost_model(name), where)
    tasks = [(c, ld, rate, seed) for c, ld, rate in grid for seed in seeds]
    results: dict[int, list[dict]] = {}
    # Every finished (cell, seed) task's rows, as they come: an interrupted run
    # keeps them (`--from-json` renders this file too).
    partial = out_dir / "rows.jsonl"
    partial.write_text("")

    def done(i: int, rows: list[dict]) -> None:
        results[i] = rows
        with partial.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        bar.update()

    with tqdm(total=len(tasks), desc="matrix", unit="cell x seed") as bar:
        if jobs <= 1:
            for i, t in enumerate(tasks):
                done(i, _cell_seed(*t, policies, profiles))
        else:
            with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
                futures = {pool.submit(_cell_seed, *t, policies, profiles): i for i, t in enumerate(tasks)}
                for future in as_completed(futures):
                    done(futures[future], future.result())
    rows = [r for i in range(len(tasks)) for r in results[i]]
    (out_dir / "matrix.json").write_text(json.dumps({"rows": rows, "seeds": seeds}, indent=1))
    footer = [f"total wall time: {time.perf_counter() - started:.0f} s in {max(jobs, 1)} processes"]
    return render_matrix(rows, out_dir, quick=quick, command=command, footer=footer,
                         target_policy=target_policy, publish=publish, report=report)


def merge_rows(runs: Sequence[list[dict]]) -> list[dict]:
    """The rows of several runs' matrix.json as one matrix (a policy measured
    later beside the ones published before): a (cell, seed, policy) row in
    more than one must be the same row (the simulator is deterministic; a
    difference means the code changed between the runs), and is kept once."""
    merged: dict[tuple, dict] = {}
    for rows in runs:
        for row in rows:
            key = (row["cell"], row["seed"], row["label"])
            kept = merged.setdefault(key, row)
            if kept["jct_mean_s"] != row["jct_mean_s"]:
                raise SystemExit(f"{key}: mean JCT {kept['jct_mean_s']} in one run, {row['jct_mean_s']} "
                                 "in another: these runs are not of the same code; run them again")
    return judged_program_by_program(list(merged.values()))


def judged_program_by_program(rows: list[dict]) -> list[dict]:
    """Rows of policies that ran apart from stock (another process, a later
    run) get their program-by-program outcome (outcomes.py) from both rows'
    per-program JCTs; rows written before those were kept stay without it."""
    stock = {(r["cell"], r["seed"]): r.get("program_jct_s") for r in rows if r["label"] == "stock"}
    out = []
    for row in rows:
        base = stock.get((row["cell"], row["seed"]))
        if "worst_program_ratio" not in row and base and row.get("program_jct_s"):
            row = {**row, **program_outcome(row["program_jct_s"], base)}
        out.append(row)
    return out


def select_rows(rows: list[dict], *, policies: Sequence[str] | None = None,
                seeds: Sequence[int] | None = None, workloads: Sequence[str] | None = None,
                load: str | None = None) -> list[dict]:
    """The rows of these policies, seeds, workloads and load (each: all if not
    given). A row's cell reads "WORKLOAD LOAD (...)"; a report needs every
    policy to have every seed."""
    return [r for r in rows if (not policies or r["label"] in policies)
            and (not seeds or r["seed"] in seeds)
            and (not workloads or r["cell"].split()[0] in workloads)
            and (not load or r["cell"].split()[1] == load)]


def render_matrix(
    rows: list[dict], out_dir: Path, *, quick: bool = False, command: str = "",
    target_policy: str | None = None, footer: Sequence[str] = (), publish: str | None = None,
    report: str = "matrix",
) -> int:
    """The report of a run's rows (also re-rendered from its matrix.json):
    a table per cell in the grid's order, the targets table of `target_policy`
    (default: `default` if it ran, else none), the heat map. `report="offload"`:
    each policy against stock with the same host tier instead (offload_report.py)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    seeds = sorted({r["seed"] for r in rows})
    if report == "offload":
        from continuum_lab.sim.offload_report import offload_tables

        text = [f"# Against stock vLLM with KV offload to host memory (seeds {seeds})", "",
                *offload_tables(rows), "", *footer,
                f"reproduce: {command or 'vllm-continuum matrix --report offload'}"]
        return _write_report("\n".join(text), out_dir, {}, command, publish)
    cells: dict[str, dict[str, dict]] = {}
    text = [f"# Measurement matrix ({'quick subset: ' if quick else ''}seeds {seeds})", ""]
    for name in dict.fromkeys(r["cell"] for r in rows):
        cell_rows = [r for r in rows if r["cell"] == name]
        cells[name] = cell_summary(cell_rows)
        stock = [r for r in cell_rows if r["label"] == "stock"]
        mean = (lambda key: sum(r[key] for r in stock) / len(stock) if stock else math.nan)
        text += cell_table(name, cells[name], mean("pool_usage_mean"),
                           mean("reuse_of_prev_prompt")) + [""]
    target_policy = target_policy or ("default" if any(r["label"] == "default" for r in rows) else None)
    if target_policy:
        text += targets_table(cells, target_policy) + [""]
    heatmap = plot_heatmap(cells, out_dir / "matrix_heatmap.png")
    text += [f"heat map: {heatmap}", *footer, f"reproduce: {command or 'vllm-continuum matrix'}"]
    return _write_report("\n".join(text), out_dir, cells, command, publish)


def _write_report(report: str, out_dir: Path, cells: dict, command: str, publish: str | None) -> int:
    (out_dir / "matrix.md").write_text(report + "\n")
    (out_dir / "cells.json").write_text(json.dumps(cells, indent=1))
    print(report)
    if publish:
        publish_report(publish, report, command)
    return 0


def load_matrix(path: Path | str | None = None) -> MatrixSpec:
    """The grid at `path`, or by name from continuum_lab/configs/ (default: matrix.yaml)."""
    where = named_yaml(path, CONFIG_DIR, "matrix") if path else MATRIX_FILE
    return MatrixSpec.model_validate(yaml.safe_load(where.read_text()))
