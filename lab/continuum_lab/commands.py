"""The lab's commands, added to the `vllm-continuum` parser (vllm_continuum/cli.py
imports this module when the lab is installed)."""

from __future__ import annotations


def register(subparsers) -> None:
    from continuum_lab import cli as trace_cli
    from continuum_lab import hot_paths
    from continuum_lab.calibration import cli as calibration_cli
    from continuum_lab.live import cli as live_cli
    from continuum_lab.prediction import cli as prediction_cli
    from continuum_lab.sim import cli as sim_cli
    from continuum_lab.sim import scale_bench_cli

    live_cli.register(subparsers)  # bench, compare
    trace_cli.register(subparsers)  # workload, convert
    sim_cli.register(subparsers)  # sim, matrix, overhead, fit-cost-model
    calibration_cli.register(subparsers)  # calibrate, sizing
    prediction_cli.register(subparsers)  # predict
    scale_bench_cli.register(subparsers)  # scale-bench
    hot_paths.register(subparsers)  # tool-call-bench, middleware-bench
