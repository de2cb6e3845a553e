"""The live benchmarks' commands:

    bench      replay a workload against a running OpenAI-compatible server
    compare    start stock vLLM and continuum one after the other, same trace; ratios

`register(subparsers)` adds them to the `vllm-continuum` parser (vllm_continuum/cli.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from continuum_lab.cli import command_line, positive_float, positive_int, publish_arg, workload_args


def _bench(args: argparse.Namespace) -> int:
    from continuum_lab.live.compare import run_bench

    return run_bench(
        args.url, args.workload, args.out, label=args.label, num_programs=args.programs,
        rate=args.rate, seed=args.seed, time_scale=args.time_scale, hints=args.hints,
        command=command_line(), publish=args.publish,
    )


def _compare(args: argparse.Namespace) -> int:
    from continuum_lab.live.compare import run_compare

    return run_compare(
        args.model_dir, args.workload, args.out, flavours=args.flavours,
        num_layers=args.layers, num_blocks=args.num_blocks, max_model_len=args.max_model_len,
        num_programs=args.programs, rate=args.rate, seed=args.seed,
        time_scale=args.time_scale, prefill_profile=args.prefill_profile,
        repeats=args.repeats, hints=args.hints, continuum_settings=args.continuum_settings,
        step_log=args.step_log, model_threads=args.model_threads, host_tier_x=args.host_tier_x,
        command=command_line(),
        publish=args.publish,
    )


def hints_arg(p: argparse.ArgumentParser) -> None:
    from continuum_lab.live.turn_body import HINT_MODES, HINTS_ALL

    p.add_argument(
        "--hints", choices=HINT_MODES, default=HINTS_ALL,
        help="all (default): agent turns carry the continuum hints (continuum_tool, "
             "continuum_last_turn in vllm_xargs) and fixed output lengths; none: only the "
             "session id (session_id and X-Session-ID), a tool turn has the engine write a "
             "<tool_call>{\"name\": ...} call through structured outputs, which the server "
             "reads by itself, and a session ends by the idle horizon")


def register(subparsers) -> None:
    from continuum_lab.live.flavours import (
        DEFAULT_HOST_TIER_X,
        DEFAULT_LAYERS,
        DEFAULT_MAX_MODEL_LEN,
        DEFAULT_NUM_BLOCKS,
        DEFAULT_WORKLOAD,
        FLAVOURS,
        continuum_settings_arg,
        model_threads_arg,
    )

    p = subparsers.add_parser("bench", help="replay an agent workload against a running server")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    workload_args(p, DEFAULT_WORKLOAD)
    p.add_argument("--label", default="server")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply arrival times and tool durations")
    hints_arg(p)
    p.add_argument("--out", type=Path, default=Path("runs/bench"))
    publish_arg(p)
    p.set_defaults(run=_bench)

    p = subparsers.add_parser(
        "compare", help="stock vLLM vs continuum (and variants), one after the other, same trace"
    )
    workload_args(p, DEFAULT_WORKLOAD)
    p.add_argument("--flavours", nargs="+", default=["stock", "continuum"], choices=sorted(FLAVOURS))
    p.add_argument("--model-dir", type=Path, help="benchmark model directory (built if missing)")
    p.add_argument("--layers", type=int, default=DEFAULT_LAYERS, help="benchmark model depth")
    p.add_argument("--num-blocks", type=int, default=DEFAULT_NUM_BLOCKS, help="KV pool, blocks of 32 tokens")
    p.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    model_threads_arg(p)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--prefill-profile", type=Path,
                   help="profile YAML for continuum (default: measured on the first server)")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="rounds of the flavours, in alternating order (A B, B A, ...); the "
                        "report gives each round's figures and the spread. Each replay is "
                        "preceded and followed by a few seconds of speed probe, which "
                        "`predict` reads (docs/calibration.md)")
    hints_arg(p)
    p.add_argument("--continuum-settings", type=continuum_settings_arg, metavar="JSON",
                   help="continuum settings for every continuum flavour, over the benchmark's "
                        "and the flavour's own, e.g. '{\"pin_cost\": \"pressure\"}' "
                        "(docs/configuration.md)")
    p.add_argument("--step-log", action="store_true",
                   help="each server's scheduler records every step it runs (what it held, how "
                        "long it took) to OUT/steps/; `predict` sets them beside the cost model "
                        "(continuum_lab/step_log.py)")
    p.add_argument("--host-tier-x", type=positive_float, default=DEFAULT_HOST_TIER_X,
                   help="the host tier of the flavours with vLLM's KV offload (stock-offload, "
                        "default-offload), as a multiple of the KV pool (default "
                        f"{DEFAULT_HOST_TIER_X:g}); continuum_lab/host_tier.py")
    p.add_argument("--out", type=Path, default=Path("runs/compare"))
    publish_arg(p)
    p.set_defaults(run=_compare)
