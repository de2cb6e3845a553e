"""One simulated engine: a real scheduler, the requests routed to it, its step in flight.

Engines of a simulated cluster share the simulated clock but step on their
own: each runs one step at a time, as vLLM's engine core does, and adds the
requests routed to it only between steps (a request that arrives during a
step waits in `inbox` for the step's end). That is also how one engine alone
behaves, so the event loop (loop.py) serves one instance and many alike.

What a router reads of an instance (routing.py) is here too: its load and
its prefix-cache hit for a prompt, asked of vLLM's KV cache manager without
allocating anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SimStats:
    steps: int = 0
    idle_jumps: int = 0  # the clock jumped to the next arrival: no engine had work
    stalls: int = 0  # schedule() returned nothing while work was queued
    scheduled_tokens: int = 0
    busy_s: float = 0.0
    scheduler_wall_s: list[float] = field(default_factory=list)  # per step, if timed
    scheduler_cpu_s: list[float] = field(default_factory=list)  # this thread's CPU time, per step
    preemptions: int = 0
    usage_s: float = 0.0  # sum over steps of the pool's occupancy x the step's time
    usage_max: float = 0.0

    @property
    def usage_mean(self) -> float:
        return self.usage_s / self.busy_s if self.busy_s else 0.0

    @classmethod
    def merged(cls, parts: list[SimStats], idle_jumps: int) -> SimStats:
        """The cluster's counters: sums (occupancy weighted by each engine's busy time), maxima."""
        if len(parts) == 1:
            parts[0].idle_jumps = idle_jumps
            return parts[0]
        return cls(
            steps=sum(p.steps for p in parts),
            idle_jumps=idle_jumps,
            stalls=sum(p.stalls for p in parts),
            scheduled_tokens=sum(p.scheduled_tokens for p in parts),
            busy_s=sum(p.busy_s for p in parts),
            scheduler_wall_s=[x for p in parts for x in p.scheduler_wall_s],
            scheduler_cpu_s=[x for p in parts for x in p.scheduler_cpu_s],
            preemptions=sum(p.preemptions for p in parts),
            usage_s=sum(p.usage_s for p in parts),
            usage_max=max(p.usage_max for p in parts),
        )


@dataclass
class Step:
    """A step between `schedule()` and `update_from_output()`: it ends at `end`."""

    output: object  # SchedulerOutput
    runner_output: object  # ModelRunnerOutput
    end: float
    sched_wall_s: float = 0.0
    sched_cpu_s: float = 0.0


class Instance:
    def __init__(self, index: int, scheduler, worker=None) -> None:
        self.index = index
        self.scheduler = scheduler
        self.worker = worker  # host_tier.OffloadWorker: the KV offload's worker side, if any
        self.inbox: list = []  # routed, added at the next step boundary
        self.step: Step | None = None
        self.stats = SimStats()
        self.routed = 0  # requests routed here

    @property
    def load(self) -> int:
        """Requests in flight: running, waiting, or routed and not yet added."""
        s = self.scheduler
        return len(s.running) + len(s.waiting) + len(self.inbox)

    def cached_tokens(self, request) -> int:
        """Tokens of the request's prompt this instance's prefix cache holds now
        (pinned blocks included: they are cached blocks); nothing is allocated."""
        _, num_tokens, *_ = self.scheduler.kv_cache_manager.get_computed_blocks(request)
        return num_tokens

    def holds_pin_for(self, request, now: float) -> bool:
        """A continuum pin whose context this request continues and whose TTL has
        not passed (an expired one is released at the instance's next call)."""
        pins = getattr(getattr(self.scheduler, "continuum", None), "pins", None)
        if not pins or not request.session_id:
            return False
        from vllm_continuum.core.sessions import session_key

        pin = pins.pin_continued_by(session_key(request.session_id), request.block_hashes)
        return pin is not None and pin.expires_at > now
