"""The simulator's commands:

    sim             paper-scale simulation driving the real schedulers, one engine or N behind a router
    matrix          every policy x workload x load x seed: Markdown and a heat map
    overhead        schedule() + update_from_output() time per step, ours vs stock
    fit-cost-model  write a simulator cost model from a `profile` YAML

`register(subparsers)` adds them to the `vllm-continuum` parser (vllm_continuum/cli.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from continuum_lab.cli import command_line, positive_int, publish_arg, workload_args


def _sim(args: argparse.Namespace) -> int:
    from continuum_lab.sim.run import run_sim

    settings = dict(kv.split("=", 1) for kv in args.set)
    if args.instances > 1 or args.routing:
        from continuum_lab.sim.cluster import run_cluster
        from continuum_lab.sim.routing import ROUTINGS

        if args.sweep is not None or args.seeds:
            raise SystemExit("sim: --instances/--routing runs one trace: no --sweep or --seeds")
        return run_cluster(
            args.workload, args.cost_model, args.out, instances=args.instances,
            routings=args.routing or ROUTINGS, policies=args.policies, num_programs=args.programs,
            rate=args.rate, seed=args.seed, settings=settings,
            routing_options={"eps": args.bounded_eps}, num_blocks=args.num_blocks,
            command=command_line(), publish=args.publish,
        )
    return run_sim(
        workload=args.workload, cost_model=args.cost_model, out_dir=args.out,
        policies=args.policies, num_programs=args.programs, rate=args.rate, seed=args.seed,
        sweep=args.sweep, sweep_programs=args.sweep_programs, seeds=args.seeds,
        settings=settings, num_blocks=args.num_blocks, command=command_line(), publish=args.publish,
    )


def _matrix(args: argparse.Namespace) -> int:
    from continuum_lab.sim.matrix import load_matrix, run_matrix

    if args.from_json:
        from continuum_lab.sim.matrix import merge_rows, render_matrix, select_rows

        rows = merge_rows([[json.loads(line) for line in path.read_text().splitlines() if line]
                           if path.suffix == ".jsonl" else json.loads(path.read_text())["rows"]
                           for path in args.from_json])
        rows = select_rows(rows, policies=args.policies, seeds=args.seeds, workloads=args.only,
                           load=args.load)
        return render_matrix(rows, args.out, command=command_line(), target_policy=args.targets,
                             publish=args.publish, report=args.report)
    spec = load_matrix(args.config)
    if args.only:
        spec = spec.model_copy(update={"cells": [c for c in spec.cells if c.workload in args.only]})
    if args.seeds:
        spec = spec.model_copy(update={"seeds": args.seeds})
    return run_matrix(spec, args.out, quick=args.quick, load=args.load, policies=args.policies,
                      command=command_line(), jobs=args.jobs, target_policy=args.targets,
                      publish=args.publish, report=args.report)


def _overhead(args: argparse.Namespace) -> int:
    from continuum_lab.sim.overhead import run_overhead

    return run_overhead(
        workload=args.workload, cost_model=args.cost_model, num_programs=args.programs,
        rate=args.rate, seed=args.seed, repeats=args.repeats, out_dir=args.out,
        policies=("stock", args.policy), command=command_line(), publish=args.publish,
    )


def _fit_cost_model(args: argparse.Namespace) -> int:
    from continuum_lab.sim.cost_model import run_fit_cost_model

    return run_fit_cost_model(args.profile, args.out, args.num_blocks, args.block_size,
                              args.decode_step_s, command=command_line())


def register(subparsers) -> None:
    from continuum_lab.sim.routing import BOUNDED_EPS, ROUTINGS

    p = subparsers.add_parser("sim", help="simulate the real schedulers at paper scale")
    workload_args(p, "swebench")
    p.add_argument("--cost-model", default="h100-llama3.1-8b",
                   help="a name in lab/continuum_lab/configs/cost_models/ or a YAML path")
    p.add_argument("--num-blocks", type=positive_int,
                   help="the KV pool in blocks, instead of the cost model's (the same server with "
                        "another pool: compare --num-blocks)")
    p.add_argument("--policies", nargs="+",
                   default=["stock", "default", "continuum", "oracle"],
                   help="stock, never, default (what ships), continuum, fixed, forever, oracle, "
                        "oracle-hindsight, oracle-eq2, the candidates (sim/policies.py "
                        "CANDIDATES) and the admission variants (RELAXED: default-request, "
                        "default-capped, forever-program, bound10-*, boundinf-*, *-open-caps); "
                        "the continuum ones also as NAME-yield or NAME-hold (plain: the "
                        "configured pressure policy)")
    p.add_argument("--sweep", type=float, nargs="*",
                   help="also sweep these arrival rates (no values: 0.02 0.04 ... 0.13)")
    p.add_argument("--sweep-programs", type=int, help="programs per sweep point (default: --programs)")
    p.add_argument("--seeds", type=int, nargs="+",
                   help="also run every policy on these workload seeds (independent traces) and "
                        "summarize the ratios over them")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a continuum setting for the continuum schedulers, e.g. COLD_START_SAMPLES=20")
    p.add_argument("--instances", type=int, default=1,
                   help="simulate this many engines (each a real scheduler) behind a router")
    p.add_argument("--routing", nargs="+", choices=ROUTINGS, metavar="ROUTING",
                   help=f"{', '.join(ROUTINGS)}: the router(s) in front of the instances, each run with every policy "
                        "(default with --instances > 1: all of them); see continuum_lab/sim/routing.py")
    p.add_argument("--bounded-eps", type=float, default=BOUNDED_EPS,
                   help="consistent_hash_bounded: no instance takes a request at ceil((1 + eps) x "
                        "the mean load)")
    p.add_argument("--out", type=Path, default=Path("runs/sim"))
    publish_arg(p)
    p.set_defaults(run=_sim)

    p = subparsers.add_parser("matrix", help="every policy on every workload, load and seed "
                              "(the measurement matrix): Markdown table and heat map")
    p.add_argument("--config", help="the grid: a name in continuum_lab/configs/ (e.g. matrix-offload) "
                   "or a YAML path (default: matrix)")
    p.add_argument("--quick", action="store_true", help="one seed, the grid's quick load only")
    p.add_argument("--only", nargs="+", metavar="WORKLOAD", help="only these workloads' cells")
    p.add_argument("--load", help="only this load of each cell (none, moderate, heavy, overload)")
    p.add_argument("--seeds", type=int, nargs="+", help="these seeds instead of the grid's")
    p.add_argument("--policies", nargs="+", help="default: the grid's")
    p.add_argument("--out", type=Path, default=Path("runs/matrix"))
    p.add_argument("--targets", metavar="POLICY",
                   help="print the matrix's targets for this policy, cell by cell "
                        "(default: `default`, if it ran)")
    p.add_argument("--from-json", type=Path, nargs="+", metavar="MATRIX_JSON",
                   help="do not run: render the report of earlier runs' matrix.json (or the "
                        "rows.jsonl an interrupted run left) into --out "
                        "(several: their rows merged, e.g. a policy run later beside the rest; "
                        "--policies, --seeds, --only and --load keep only those rows)")
    p.add_argument("--report", choices=("matrix", "offload"), default="matrix",
                   help="offload: each policy against stock with the same host tier "
                        "(`NAME+offload-TIER` labels; sim/offload_report.py)")
    p.add_argument("--jobs", type=int, default=1,
                   help="processes running (cell, seed) tasks side by side (results do not depend on it)")
    publish_arg(p)
    p.set_defaults(run=_matrix)

    p = subparsers.add_parser("overhead", help="scheduler time per step, continuum vs stock")
    workload_args(p, "swebench")
    p.add_argument("--cost-model", default="h100-llama3.1-8b")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--policy", default="default",
                   help="the continuum policy timed against stock (default: what ships; "
                        "`continuum`: the paper's settings; any `sim` policy label)")
    p.add_argument("--out", type=Path, default=Path("runs/overhead"))
    publish_arg(p)
    p.set_defaults(run=_overhead)

    p = subparsers.add_parser("fit-cost-model",
                              help="write a simulator cost model from a `profile` YAML")
    p.add_argument("--profile", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--num-blocks", type=positive_int, default=160)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--decode-step-s", type=float, help="measured decode step time (s)")
    p.set_defaults(run=_fit_cost_model)
