"""`vllm-continuum calibrate` and `sizing` (a workload read on a calibrated cost
model): registered by `register(subparsers)` (vllm_continuum/cli.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from continuum_lab.calibration.server import FIELDS
from continuum_lab.cli import command_line, positive_int, workload_args
from continuum_lab.live.flavours import (
    DEFAULT_MAX_MODEL_LEN, DEFAULT_NUM_BLOCKS, bench_server_env, model_threads_arg)


def _calibrate(args: argparse.Namespace) -> int:
    from continuum_lab.calibration.command import run_calibrate

    def calibrate(url: str, server_env: dict[str, str] | None = None) -> int:
        return run_calibrate(
            url, args.out, flags={k: getattr(args, k) for k in FIELDS}, lengths=args.lengths,
            batches=args.batches, contexts=args.contexts, repeats=args.repeats,
            decode_tokens=args.decode_tokens, seed=args.seed, guided=not args.no_guided,
            command=command_line(), server_env=server_env,
        )

    if args.bench_server is None:
        return calibrate(args.url)
    from continuum_lab.calibration.bench_server import bench_server

    blocks = args.num_gpu_blocks or DEFAULT_NUM_BLOCKS
    window = args.max_model_len or DEFAULT_MAX_MODEL_LEN
    env = bench_server_env(args.model_threads)
    with bench_server(args.bench_server, blocks, window, args.logs, env) as url:
        return calibrate(url, env)


def _sizing(args: argparse.Namespace) -> int:
    from continuum_lab.calibration.sizing import sizing_report
    from continuum_lab.sim.cost_model import load_cost_model
    from continuum_lab.workload_spec import load_trace

    cost = load_cost_model(args.cost_model).with_pool(args.num_blocks)
    trace = load_trace(args.workload, num_programs=args.programs, arrival_rate=args.rate, seed=args.seed)
    print(sizing_report(trace, cost, args.batch))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help="measure a running server's step time and write a simulator cost model",
        description="Times prefills (TTFT of fresh prompts, cold and after a cached prefix) and "
                    "decode steps (inter-token gaps of B concurrent streams at context C) on the "
                    "server at --url, fits the linear step model of sim/cost_model.py and writes "
                    "it with the server's pool and limits and the measurements "
                    "(docs/calibration.md). Run it on an otherwise idle server.")
    server = p.add_mutually_exclusive_group()
    server.add_argument("--url", default="http://127.0.0.1:8000", help="the vLLM server to measure")
    server.add_argument("--bench-server", type=positive_int, metavar="LAYERS",
                        help="instead of --url: start the CPU benchmark's server as `compare` does "
                             f"(the benchmark model of this depth; --num-gpu-blocks, default "
                             f"{DEFAULT_NUM_BLOCKS}, and --max-model-len, default "
                             f"{DEFAULT_MAX_MODEL_LEN}), calibrate it, stop it")
    p.add_argument("--logs", type=Path, default=Path("runs/calibrate-logs"),
                   help="--bench-server: where the server's log goes")
    model_threads_arg(p)
    p.add_argument("--out", type=Path, required=True, help="the cost-model YAML to write")
    p.add_argument("--lengths", type=positive_int, nargs="+",
                   help="cold prefill lengths (default: 16, then doubling from 128 to the context window)")
    p.add_argument("--batches", type=positive_int, nargs="+", default=[1, 4, 8, 16, 64],
                   help="decode batch sizes B (those over the pool or max_num_seqs are left out)")
    p.add_argument("--contexts", type=positive_int, nargs="+",
                   help="decode contexts C (default: 128, a quarter, half and nearly all of the window)")
    p.add_argument("--repeats", type=positive_int, default=2, help="repeats of each point")
    p.add_argument("--decode-tokens", type=positive_int, default=48,
                   help="tokens each decode stream generates")
    p.add_argument("--seed", type=int, default=0, help="prompts and probe order")
    p.add_argument("--no-guided", action="store_true",
                   help="skip the decode points under a grammar (structured outputs), which are "
                        "reported beside the fit (what --hints none's tool calls cost), not fitted")
    for name in FIELDS:
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=positive_int,
                       help=f"{name}, if the server does not say it")
    p.set_defaults(run=_calibrate)

    p = subparsers.add_parser(
        "sizing", help="a workload on a cost model: re-prefill vs decode of resumed turns, pool vs contexts")
    workload_args(p, "cpu-overload")
    p.add_argument("--cost-model", required=True, help="e.g. one `calibrate` wrote for the server")
    p.add_argument("--num-blocks", type=positive_int, help="KV pool in blocks (default: the cost model's)")
    p.add_argument("--batch", type=positive_int, default=8, help="decodes beside each other for the batched figure")
    p.set_defaults(run=_sizing)
