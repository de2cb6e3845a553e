"""The vLLM general plugin: teaches `--scheduler-cls continuum` our scheduler.

vLLM resolves `--scheduler-cls` by qualified name only (no registry), and
loads general plugins in every process before it resolves the scheduler.
So the plugin wraps `SchedulerConfig.get_scheduler_cls` to map the short
name to the variant matching vLLM's async-scheduling decision. It runs
several times per process (vLLM's rule for plugins): the wrap is applied once.
It never fails for users who do not ask for continuum: the version check
runs only when the name is resolved.

It also wires the Prometheus exporter (`vllm_continuum.metrics`): the
snapshot directory the engine core writes to, and the collector that serves
`continuum_*` metrics on vLLM's own `/metrics`. The collector reports nothing
unless a continuum engine core has written a snapshot, so vLLM's `/metrics`
is unchanged for servers that do not use the continuum scheduler.

And, in the front end of a data-parallel server, it keeps a session's turns
on one DP rank (`vllm_continuum.adapter.dp_affinity`).
"""

from __future__ import annotations

SCHEDULER_NAMES = frozenset({"continuum"})


def register() -> None:
    from vllm_continuum.adapter.metrics_registration import install

    install()
    _register_scheduler_name()
    _install_dp_affinity()


def _install_dp_affinity() -> None:
    try:
        from vllm_continuum.adapter.dp_affinity import install

        install()
    except Exception as exc:  # noqa: BLE001  (never break vLLM for affinity)
        import logging

        logging.getLogger("vllm.continuum").warning(
            "continuum: DP session affinity not installed (%r)", exc
        )


def _register_scheduler_name() -> None:
    from vllm.config.scheduler import SchedulerConfig

    from vllm_continuum.adapter.patching import patch_once

    def wrap(stock):
        def get_scheduler_cls(self: SchedulerConfig):
            if isinstance(self.scheduler_cls, str) and self.scheduler_cls in SCHEDULER_NAMES:
                return resolve_scheduler_cls(bool(self.async_scheduling))
            return stock(self)

        return get_scheduler_cls

    patch_once(SchedulerConfig, "get_scheduler_cls", wrap)


def resolve_scheduler_cls(async_scheduling: bool) -> type:
    from vllm_continuum.adapter.compat import check_vllm_version

    check_vllm_version()
    from vllm_continuum.adapter.scheduler import ContinuumAsyncScheduler, ContinuumScheduler

    return ContinuumAsyncScheduler if async_scheduling else ContinuumScheduler
