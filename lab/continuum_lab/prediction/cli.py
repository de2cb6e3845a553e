"""`vllm-continuum predict`: registered by `register(subparsers)` (vllm_continuum/cli.py)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _predict(args: argparse.Namespace) -> int:
    from continuum_lab.cli import command_line
    from continuum_lab.prediction.command import run_predict

    return run_predict(args.run_dir, args.cost_model, out_dir=args.out, publish=args.publish,
                       command=command_line())


def register(subparsers) -> None:
    from continuum_lab.cli import publish_arg

    p = subparsers.add_parser(
        "predict", help="simulate a compare run's rounds on their sent traces, beside what they measured",
        description="For each round and flavour of a `compare` run, replays the trace that replay "
                    "sent in the simulator, with the server's scheduler and settings and the given "
                    "cost model (e.g. one written by `calibrate` on that server), and prints "
                    "predicted beside measured: mean JCT, makespan, reuse, one-shot p99 TTFT, the "
                    "ratio to stock and the error, then what tells them apart (docs/calibration.md).")
    p.add_argument("run_dir", type=Path, help="the --out directory of a compare run")
    p.add_argument("--cost-model", required=True,
                   help="a cost-model YAML (`calibrate --out`) or a shipped name")
    p.add_argument("--out", type=Path, help="report directory (default: RUN_DIR/predict)")
    publish_arg(p)
    p.set_defaults(run=_predict)
