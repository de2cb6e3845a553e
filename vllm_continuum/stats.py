"""What the pin machinery did, recorded by the scheduler as it happens.

The scheduler reports events through the `on_*` methods and offers its
state to `publish` after each step; how figures reach Prometheus is this
module's concern, not the scheduler's. Plain Python so tests and
benchmarks read the counters directly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from vllm_continuum.policy.pin_table import Pin, ReleaseReason


@dataclass
class ContinuumStats:
    pins_by_tool: Counter[str] = field(default_factory=Counter)
    releases_by_reason: Counter[str] = field(default_factory=Counter)
    resumes_by_outcome: Counter[str] = field(default_factory=Counter)  # pinned / unpinned
    resume_prompt_tokens: int = 0
    resume_cached_tokens: int = 0
    invalid_hints: int = 0
    pins_refused_by_cap: int = 0
    # Recent events, newest last (bounded: the oldest half goes when full).
    ttl_decisions: list[tuple[str, float, str]] = field(default_factory=list)
    tool_durations: list[tuple[str, float]] = field(default_factory=list)
    max_kept_events: int = 1000

    # --- events ------------------------------------------------------------
    def on_pin(self, pin: Pin) -> None:
        self.pins_by_tool[pin.tool] += 1

    def on_pin_refused(self, tool: str) -> None:
        self.pins_refused_by_cap += 1

    def on_release(self, pin: Pin, reason: ReleaseReason, now: float) -> None:
        self.releases_by_reason[reason.value] += 1

    def on_resume(self, had_pin: bool, prompt_tokens: int, cached_tokens: int) -> None:
        self.resumes_by_outcome["pinned" if had_pin else "unpinned"] += 1
        self.resume_prompt_tokens += prompt_tokens
        self.resume_cached_tokens += cached_tokens

    def on_invalid_hints(self, count: int) -> None:
        self.invalid_hints += count

    def on_ttl_decision(self, tool: str, ttl_s: float, source: str) -> None:
        self._keep(self.ttl_decisions, (tool, ttl_s, source))

    def on_tool_duration(self, tool: str, seconds: float) -> None:
        self._keep(self.tool_durations, (tool, seconds))

    # --- state -------------------------------------------------------------
    def publish(
        self,
        pins: Iterable[Pin],
        pool_size: int,
        now: float,
        idle: bool,
        held: Callable[[str], bool],
    ) -> None:
        """The scheduler's state after a step; `held(session)` tells whether a
        pin is kept past its TTL for a queued turn. (No exporter yet.)"""

    def _keep(self, events: list, event: tuple) -> None:
        if len(events) >= self.max_kept_events:
            del events[: self.max_kept_events // 2]
        events.append(event)
