"""Discrete-event simulation that drives the real schedulers (stock vLLM's and
ours) with synthetic model outputs, a step-time cost model and a simulated
clock. Entry points: `run_sim`, `run_overhead`."""


def run_sim(*args, **kwargs) -> int:
    from vllm_continuum.experiments.sim.run import run_sim as _run

    return _run(*args, **kwargs)


def run_overhead(*args, **kwargs) -> int:
    from vllm_continuum.experiments.sim.overhead import run_overhead as _run

    return _run(*args, **kwargs)


__all__ = ["run_overhead", "run_sim"]
