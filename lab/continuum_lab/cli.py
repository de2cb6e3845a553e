"""The experiment commands that only make traces, and what every experiment
command's parser shares:

    workload   write a workload's trace (JSONL) and print its statistics
    convert    recorded agent transcripts (mini-swe-agent, OpenAI messages) to a trace

`register(subparsers)` adds them to the `vllm-continuum` parser (vllm_continuum/cli.py),
beside the live benchmarks' (live/cli.py) and the simulator's (sim/cli.py).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def command_line() -> str:
    """The command as typed, recorded in every report so that it can be rerun."""
    return "vllm-continuum " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def positive_int(text: str) -> int:
    """argparse type: a count (of repeats, tokens, blocks, ...), at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 1")
    return value


def positive_float(text: str) -> float:
    """argparse type: a size or a multiple (of the KV pool, ...), above 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number above 0")
    return value


def publish_arg(p: argparse.ArgumentParser) -> None:
    """`--publish NAME`, for the commands that print a measured report (publish.py)."""
    from continuum_lab.publish import result_name

    p.add_argument("--publish", type=result_name, metavar="NAME",
                   help="also write the report, with this command line, the date and the git "
                        "commit, to docs/results/NAME.md (run from the repository root)")


def workload_args(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--workload", default=default,
                   help="a spec name in lab/continuum_lab/configs/workloads/ (swebench, bfcl, "
                        "cpu-agent, mixed, cpu-mixed), a spec YAML, or a trace .jsonl")
    p.add_argument("--programs", type=int, help="number of programs (default: the spec's)")
    p.add_argument("--rate", type=float, help="arrival rate, programs/s (default: the spec's)")
    p.add_argument("--seed", type=int, help="workload seed (default: the spec's)")


def _workload(args: argparse.Namespace) -> int:
    import json

    from continuum_lab.workload_spec import load_trace

    trace = load_trace(args.workload, num_programs=args.programs, arrival_rate=args.rate,
                       seed=args.seed)
    if args.out:
        trace.save(args.out)
        print(f"wrote {args.out}")
    print(json.dumps(trace.summary(), indent=1))
    return 0


def _convert(args: argparse.Namespace) -> int:
    import json

    from continuum_lab.transcripts import convert

    trace = convert(args.inputs, args.out, rate=args.rate, seed=args.seed,
                    tokenizer=args.tokenizer, durations_from=args.durations_from)
    print(f"wrote {args.out}: {json.dumps(trace.meta)}")
    print(json.dumps(trace.summary(), indent=1))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("workload", help="generate a workload trace (JSONL) and print its statistics")
    workload_args(p, "swebench")
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
