"""Benchmarks: agent workloads and traces, the replay client, the comparison
runner and reports. Entry points: `run_bench`, `run_compare`, and
`register(subparsers)` for the command line (`bench/cli.py`)."""

from vllm_continuum.experiments.cli import register


def run_bench(*args, **kwargs) -> int:
    from vllm_continuum.experiments.live.compare import run_bench as _run

    return _run(*args, **kwargs)


def run_compare(*args, **kwargs) -> int:
    from vllm_continuum.experiments.live.compare import run_compare as _run

    return _run(*args, **kwargs)


__all__ = ["register", "run_bench", "run_compare"]
