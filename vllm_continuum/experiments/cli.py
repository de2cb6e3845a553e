"""Command-line entry points of the benchmarks: `register(subparsers)` adds

    bench      replay a workload against a running OpenAI-compatible server
    compare    start stock vLLM and continuum one after the other, same trace; ratios
    workload   write a workload's trace (JSONL) and print its statistics
    convert    recorded agent transcripts (mini-swe-agent, OpenAI messages) to a trace
    sim        paper-scale simulation driving the real schedulers (sim/), one engine or N behind a router
    overhead   schedule() + update_from_output() time per step, ours vs stock

to an argparse subparsers object (vllm_continuum/cli.py wires it in), and
`python -m vllm_continuum.experiments COMMAND ...` runs them standalone.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def _command_line() -> str:
    return "vllm-continuum " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _bench(args: argparse.Namespace) -> int:
    from vllm_continuum.experiments.live.compare import run_bench

    return run_bench(
        args.url, args.workload, args.out, label=args.label, num_programs=args.programs,
        rate=args.rate, seed=args.seed, time_scale=args.time_scale, command=_command_line(),
    )


def _compare(args: argparse.Namespace) -> int:
    from vllm_continuum.experiments.live.compare import run_compare

    return run_compare(
        args.model_dir, args.workload, args.out, flavours=args.flavours,
        num_layers=args.layers, num_blocks=args.num_blocks, max_model_len=args.max_model_len,
        num_programs=args.programs, rate=args.rate, seed=args.seed,
        time_scale=args.time_scale, prefill_profile=args.prefill_profile,
        repeats=args.repeats, command=_command_line(),
    )


def _workload(args: argparse.Namespace) -> int:
    import json

    from vllm_continuum.experiments.workload_spec import load_trace

    trace = load_trace(args.workload, num_programs=args.programs, arrival_rate=args.rate,
                       seed=args.seed)
    if args.out:
        trace.save(args.out)
        print(f"wrote {args.out}")
    print(json.dumps(trace.summary(), indent=1))
    return 0


def _convert(args: argparse.Namespace) -> int:
    import json

    from vllm_continuum.experiments.transcripts import convert

    trace = convert(args.inputs, args.out, rate=args.rate, seed=args.seed,
                    tokenizer=args.tokenizer, durations_from=args.durations_from)
    print(f"wrote {args.out}: {json.dumps(trace.meta)}")
    print(json.dumps(trace.summary(), indent=1))
    return 0


def _sim(args: argparse.Namespace) -> int:
    from vllm_continuum.experiments.sim.run import run_sim

    settings = dict(kv.split("=", 1) for kv in args.set)
    if args.instances > 1 or args.routing:
        from vllm_continuum.experiments.sim.cluster import run_cluster
        from vllm_continuum.experiments.sim.routing import ROUTINGS

        if args.sweep is not None or args.seeds:
            raise SystemExit("sim: --instances/--routing runs one trace: no --sweep or --seeds")
        return run_cluster(
            args.workload, args.cost_model, args.out, instances=args.instances,
            routings=args.routing or ROUTINGS, policies=args.policies, num_programs=args.programs,
            rate=args.rate, seed=args.seed, settings=settings,
            routing_options={"eps": args.bounded_eps}, command=_command_line(),
        )
    return run_sim(
        workload=args.workload, cost_model=args.cost_model, out_dir=args.out,
        policies=args.policies, num_programs=args.programs, rate=args.rate, seed=args.seed,
        sweep=args.sweep, sweep_programs=args.sweep_programs, seeds=args.seeds,
        settings=settings, command=_command_line(),
    )


def _overhead(args: argparse.Namespace) -> int:
    from vllm_continuum.experiments.sim.overhead import run_overhead

    return run_overhead(
        workload=args.workload, cost_model=args.cost_model, num_programs=args.programs,
        rate=args.rate, seed=args.seed, repeats=args.repeats, out_dir=args.out,
        command=_command_line(),
    )


def _fit_cost_model(args: argparse.Namespace) -> int:
    from vllm_continuum.experiments.sim.cost_model import run_fit_cost_model

    return run_fit_cost_model(args.profile, args.out, args.num_blocks, args.block_size,
                              args.decode_step_s, command=_command_line())


def _workload_args(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--workload", default=default,
                   help="a spec name in configs/workloads/ (swebench, bfcl, cpu-agent, mixed, cpu-mixed), "
                        "a spec YAML, or a trace .jsonl")
    p.add_argument("--programs", type=int, help="number of programs (default: the spec's)")
    p.add_argument("--rate", type=float, help="arrival rate, programs/s (default: the spec's)")
    p.add_argument("--seed", type=int, help="workload seed (default: the spec's)")


def register(subparsers) -> None:
    from vllm_continuum.experiments.live.compare import FLAVOURS
    from vllm_continuum.experiments.sim.routing import BOUNDED_EPS, ROUTINGS

    p = subparsers.add_parser("bench", help="replay an agent workload against a running server")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    _workload_args(p, "cpu-agent")
    p.add_argument("--label", default="server")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply arrival times and tool durations")
    p.add_argument("--out", type=Path, default=Path("runs/bench"))
    p.set_defaults(run=_bench)

    p = subparsers.add_parser(
        "compare", help="stock vLLM vs continuum (and variants), one after the other, same trace"
    )
    _workload_args(p, "cpu-agent")
    p.add_argument("--flavours", nargs="+", default=["stock", "continuum"], choices=sorted(FLAVOURS))
    p.add_argument("--model-dir", type=Path, help="benchmark model directory (built if missing)")
    p.add_argument("--layers", type=int, default=2, help="benchmark model depth")
    p.add_argument("--num-blocks", type=int, default=160, help="KV pool, blocks of 32 tokens")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--prefill-profile", type=Path,
                   help="profile YAML for continuum (default: measured on the first server)")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds of the flavours, in alternating order (A B, B A, ...)")
    p.add_argument("--out", type=Path, default=Path("runs/compare"))
    p.set_defaults(run=_compare)

    p = subparsers.add_parser("workload", help="generate a workload trace (JSONL) and print its statistics")
    _workload_args(p, "swebench")
    p.add_argument("--out", type=Path)
    p.set_defaults(run=_workload)

    p = subparsers.add_parser(
        "convert", help="recorded agent chat transcripts (e.g. mini-swe-agent .traj.json) to a trace"
    )
    p.add_argument("inputs", type=Path, nargs="+", help="JSON/JSONL files or directories")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rate", type=float, default=0.1, help="Poisson arrival rate, programs/s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", help="HF tokenizer to count tokens (default: 4 chars/token)")
    p.add_argument("--durations-from", default="swebench",
                   help="workload spec whose tool profiles fill in durations without timestamps")
    p.set_defaults(run=_convert)

    p = subparsers.add_parser("sim", help="simulate the real schedulers at paper scale")
    _workload_args(p, "swebench")
    p.add_argument("--cost-model", default="h100-llama3.1-8b",
                   help="a name in configs/cost_models/ or a YAML path")
    p.add_argument("--policies", nargs="+",
                   default=["stock", "continuum", "oracle"],
                   help="stock, never, continuum, fixed, forever, oracle, oracle-eq2; the "
                        "continuum ones also as NAME-yield or NAME-hold (plain: the configured "
                        "pressure policy)")
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
                        "(default with --instances > 1: all of them); see sim/routing.py")
    p.add_argument("--bounded-eps", type=float, default=BOUNDED_EPS,
                   help="consistent_hash_bounded: no instance takes a request at ceil((1 + eps) x "
                        "the mean load)")
    p.add_argument("--out", type=Path, default=Path("runs/sim"))
    p.set_defaults(run=_sim)

    p = subparsers.add_parser("overhead", help="scheduler time per step, continuum vs stock")
    _workload_args(p, "swebench")
    p.add_argument("--cost-model", default="h100-llama3.1-8b")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("runs/overhead"))
    p.set_defaults(run=_overhead)

    p = subparsers.add_parser("fit-cost-model",
                              help="write a simulator cost model from a `profile` YAML")
    p.add_argument("--profile", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--num-blocks", type=int, default=160)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--decode-step-s", type=float, help="measured decode step time (s)")
    p.set_defaults(run=_fit_cost_model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_continuum.experiments", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.run(args)
