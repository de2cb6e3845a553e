"""`vllm-continuum scale-bench`: the command, its checks and its table (the
scenarios and their runner: scale_bench.py).

The target, checked per scenario: at each load our p99 step is
within 1.2x of stock's plus 50 us; from 1x to 10x our p99 step and our p99
arrival grow no more than stock's, with the same allowance (ours at 10x <=
1.2 x stock's growth x ours at 1x + 50 us; a stock growth below 1 counts as 1);
neither scheduler ran out of its budget. Scenario e also times the metrics
snapshot itself (ours only): its p50 may grow at most 1.2x as much as the pins
(linear). Our p99 arrival against stock's at each load is printed, not gated
(the target names the step).

`--layers` also runs the configurations of `scale_bench.LAYERS` beside them
and prints where our cost over stock goes, per request a step admits.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

RATIO, SLACK_US, LOADS = 1.2, 50.0, (1, 10)


def _p99(side: dict, metric: str) -> float | None:
    return side.get(metric, {}).get("p99_us")


def check(runs: dict) -> dict:
    """PASS/FAIL of one scenario, with why: runs maps a load (1, 10) to run_scenario's result."""
    why, notes = [], []
    for load, run in runs.items():
        for side in ("ours", "stock"):
            if run[side]["aborted"]:
                why.append(f"{side} at {load}x: {run[side]['aborted']}")
        for metric, out in (("steps", why), ("arrivals", notes)):
            ours, stock = _p99(run["ours"], metric), _p99(run["stock"], metric)
            if ours is not None and stock is not None and ours > RATIO * stock + SLACK_US:
                out.append(f"{metric} p99 at {load}x: {ours:.0f} us > {RATIO} x {stock:.0f} + {SLACK_US:.0f}")
    growth = {}
    if len(runs) >= 2:  # from the lowest load to the highest
        lo, hi = runs[min(runs)], runs[max(runs)]
        for metric in ("steps", "arrivals"):
            g = {s: _ratio(_p99(hi[s], metric), _p99(lo[s], metric)) for s in ("ours", "stock")}
            growth[metric] = g
            if None in g.values():
                continue
            # Stock's growth below 1 is noise (a cost does not shrink with load): taken as 1.
            limit = RATIO * max(1.0, g["stock"]) * _p99(lo["ours"], metric) + SLACK_US
            if _p99(hi["ours"], metric) > limit:
                why.append(f"{metric} p99 grew {g['ours']:.2f}x: {_p99(hi['ours'], metric):.0f} us > "
                           f"{RATIO} x max(1, stock's {g['stock']:.2f}x) x {_p99(lo['ours'], metric):.0f} "
                           f"+ {SLACK_US:.0f}")
        snap = _ratio(_p50(hi["ours"], "snapshots"), _p50(lo["ours"], "snapshots"))
        if snap is not None:
            growth["snapshots"] = {"ours": snap}
            load = hi["n"] / lo["n"]
            if snap > RATIO * load:
                why.append(f"metrics snapshot p50 grew {snap:.1f}x for {load:g}x the pins (linear: "
                           f"<= {RATIO * load:g}x)")
    return {"verdict": "FAIL" if why else "PASS", "why": why, "notes": notes, "growth": growth}


def _p50(side: dict, metric: str) -> float | None:
    return side.get(metric, {}).get("p50_us")


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def _cell(stats: dict | None) -> str:
    if not stats:
        return f"{'-':>26}"
    return f"{stats['p50_us']:>8.0f} {stats['p99_us']:>8.0f} {stats['max_us']:>8.0f}"


def table(results: dict, checks: dict) -> str:
    from continuum_lab.sim.scale_bench import SCENARIOS

    what = {s.key: s.what for s in SCENARIOS}
    head = (f"{'':3}{'load':>5} {'N':>7} {'sched':6} {'steps':>6} | {'step us: p50':>12} {'p99':>8} "
            f"{'max':>8} | {'arrival us: p50':>15} {'p99':>8} {'max':>8} | note")
    lines = [head, "-" * len(head)]
    for key, runs in results.items():
        for load, run in runs.items():
            for side in ("ours", "stock"):
                r = run[side]
                note = r["aborted"] or ""
                if r.get("snapshots"):
                    note += f"metrics snapshot p50 {r['snapshots']['p50_us']:.0f} us"
                if r["aborted"] and r.get("setup_arrivals"):
                    note += f"; last setup arrivals p50 {r['setup_arrivals']['p50_us']:.0f} us"
                steps = r.get("steps", {}).get("count", 0)
                lines.append(f"{key:3}{load:>4}x {run['n']:>7} {side:6} {steps:>6} | "
                             f"{_cell(r.get('steps')):>30} | {_cell(r.get('arrivals')):>33} | {note}")
        c = checks[key]
        g = c["growth"]
        grow = "; ".join(f"{m} " + ", ".join(f"{side} {x or '-'}x" for side, x in v.items())
                         for m, v in g.items())
        lines.append(f"{key}: {what[key]} -> {c['verdict']}" + (f"  (p99 growth: {grow})" if grow else ""))
        lines += [f"     {w}" for w in c["why"]]
        lines += [f"     (not gated) {w}" for w in c["notes"]]
    return "\n".join(lines)


def layers_table(results: dict) -> str:
    """Per scenario and load: each layer's mean and p99 step, and what it adds
    over the layer before, per request the measured steps admitted (their mean):
    only where both admitted as many (pins change who fits, as in c)."""
    from continuum_lab.sim.scale_bench import LAYERS

    head = (f"{'':3}{'load':>5} {'layer':6} | {'step us: mean':>13} {'p99':>8} | "
            f"{'admitted/step':>13} | {'adds us/request':>15}")
    lines = [head, "-" * len(head)]
    for key, runs in results.items():
        for load, run in runs.items():
            before = None  # (mean step, admitted per step) of the layer before
            for name in LAYERS:
                r = run[name]
                steps = r.get("steps")
                if not steps:
                    lines.append(f"{key:3}{load:>4}x {name:6} | {'-':>13} | {r['aborted'] or ''}")
                    before = None
                    continue
                per_step = r["admitted"] / steps["count"]
                adds = ""
                if before is not None and per_step:
                    same = abs(per_step - before[1]) <= 0.05 * per_step
                    adds = f"{(steps['mean_us'] - before[0]) / per_step:.1f}" if same else "(admits differ)"
                lines.append(f"{key:3}{load:>4}x {name:6} | {steps['mean_us']:>13.0f} {steps['p99_us']:>8.0f} | "
                             f"{per_step:>13.1f} | {adds:>15}")
                before = steps["mean_us"], per_step
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from continuum_lab.sim.policies import sim_model_dir
    from continuum_lab.sim.scale_bench import LAYERS, SCENARIOS, SIDES, run_scenario
    from vllm_continuum.tools.tiny_model import build_tiny_model

    if args.quick:
        args.scale, args.steps = args.scale * 0.1, min(args.steps, 60)
        args.budget, args.setup_budget = min(args.budget, 10.0), min(args.setup_budget, 10.0)
    command = (f"vllm-continuum scale-bench --scenarios {' '.join(args.scenarios)} --loads "
               f"{' '.join(map(str, args.loads))} --scale {args.scale:g} --steps {args.steps} "
               f"--budget {args.budget:g} --setup-budget {args.setup_budget:g} --clock {args.clock}"
               + (" --layers" if args.layers else ""))
    sides = LAYERS if args.layers else SIDES
    budgets = {"setup": args.setup_budget, "steps": args.budget}
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    model_dir = str(build_tiny_model(args.model_dir)) if args.model_dir else sim_model_dir(4096)
    chosen = [s for s in SCENARIOS if s.key in args.scenarios]

    results: dict = {}
    with tqdm(total=len(chosen) * len(args.loads) * args.steps, desc="scale-bench", unit="step") as bar:
        for scn in chosen:
            for load in args.loads:
                n = max(1, round(scn.base * load * args.scale))
                bar.set_postfix_str(f"{scn.key} {load}x N={n}")
                run = run_scenario(scn, n, model_dir, args.steps, budgets, clock, bar=bar, sides=sides)
                results.setdefault(scn.key, {})[load] = run
    checks = {key: check(runs) for key, runs in results.items()}
    print(f"\nvllm-continuum scale-bench: vLLM's Scheduler (stock) and ContinuumScheduler (ours), "
          f"interleaved, {args.steps} measured steps per scenario and load; budgets per scheduler: "
          f"setup {args.setup_budget:g}s, steps {args.budget:g}s; times in us "
          f"({'time.perf_counter' if args.clock == 'wall' else 'time.thread_time, CPU'}): "
          f"step = schedule() + update_from_output(), arrival = add_request()")
    print(table(results, checks))
    print(f"target: p99 step within {RATIO}x stock + {SLACK_US:.0f} us at each load; p99 step and "
          f"arrival growth 1x->10x no worse than stock's (same allowance); within budget; "
          f"{sum(c['verdict'] == 'PASS' for c in checks.values())}/{len(checks)} scenarios pass")
    if args.layers:
        print(f"\nwhere our cost goes (layers: {', '.join(LAYERS)}; each adds one part over the one "
              f"before, side by side in the same run):")
        print(layers_table(results))
    print(f"reproduce: {command}")
    if args.out:
        report = {"command": command, "steps": args.steps, "budgets_s": budgets, "clock": args.clock,
                  "scale": args.scale, "target": {"ratio": RATIO, "slack_us": SLACK_US},
                  "results": results, "checks": checks}
        args.out.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")
    return 0


def register(subparsers) -> None:
    from continuum_lab.cli import positive_int

    from continuum_lab.sim import scale_bench

    target = __doc__[__doc__.index("The target"):]
    p = subparsers.add_parser("scale-bench", help="step and arrival cost at scale: ours vs stock",
                              description=f"{scale_bench.__doc__}\n{target}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", nargs="+", choices=list("abcde"), default=list("abcde"),
                   help="a: tracked sessions, b: queued requests, c: pinned blocks with failed "
                        "allocations, d: one session's tool-hinted requests, e: metrics snapshot pins")
    p.add_argument("--loads", type=positive_int, nargs="+", default=list(LOADS),
                   help="multiples of each scenario's base size (default: 1 10)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every scenario's size")
    p.add_argument("--steps", type=positive_int, default=300, help="measured steps per scenario and load")
    p.add_argument("--budget", type=float, default=60.0,
                   help="seconds one scheduler may spend in one scenario's measured steps, per load")
    p.add_argument("--setup-budget", type=float, default=90.0,
                   help="seconds one scheduler may spend building one scenario's state, per load")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall: time.perf_counter (default); cpu: the thread's CPU time, which "
                        "other processes on shared cores do not inflate")
    p.add_argument("--quick", action="store_true", help="a tenth of the sizes, 60 steps, 10 s budgets")
    p.add_argument("--layers", action="store_true",
                   help="also run our hooks alone (ttl_policy never, queue_order fcfs) and with our "
                        "lane queue (ttl_policy never), and print what each part adds per request")
    p.add_argument("--model-dir", type=Path,
                   help="the tiny model (built if missing; default: the simulator's, in ~/.cache)")
    p.add_argument("--out", type=Path, help="also write the results as JSON")
    p.set_defaults(run=_run)
