"""Counters of what the pin machinery did, kept by the scheduler.

Plain Python so tests and benchmarks read them directly; exporting them to
Prometheus is a separate concern.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


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

    def record_ttl(self, tool: str, ttl_s: float, source: str) -> None:
        self._keep(self.ttl_decisions, (tool, ttl_s, source))

    def record_tool_duration(self, tool: str, seconds: float) -> None:
        self._keep(self.tool_durations, (tool, seconds))

    def _keep(self, events: list, event: tuple) -> None:
        if len(events) >= self.max_kept_events:
            del events[: self.max_kept_events // 2]
        events.append(event)
