"""The scheduler classes `--scheduler-cls continuum` resolves to.

One mixin over both of vLLM's schedulers, so async scheduling stays on
wherever vLLM turns it on.
"""

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_continuum.adapter.scheduler_mixin import ContinuumSchedulerMixin


class ContinuumScheduler(ContinuumSchedulerMixin, Scheduler):
    """Continuum over vLLM's synchronous scheduler."""


class ContinuumAsyncScheduler(ContinuumSchedulerMixin, AsyncScheduler):
    """Continuum over vLLM's async scheduler (vLLM's default on GPUs)."""


__all__ = ["ContinuumAsyncScheduler", "ContinuumScheduler", "ContinuumSchedulerMixin"]
