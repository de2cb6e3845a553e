"""Recorded tool durations, as empirical CDFs.

- `ToolDurations`: every program's, per tool and across all tools (the
  paper's Eq. 2, `ttl_policy: continuum`, learns from them, and the
  metrics report them). Each history keeps the newest `limit` durations both
  in arrival order (to forget the oldest) and sorted (so P(tau) and the TTL
  arg-max are one pass, and an insertion is a binary search).
- `CallHistory`: one program's own last calls, what the default rule
  (`ttl_policy: hazard`) decides that program's pins on: another program's
  traffic never enters it, so no client can change another's TTLs.
"""

from __future__ import annotations

import bisect
from collections import deque

PROGRAM_CALLS = 32  # a program's last calls kept (`CallHistory`)


class DurationHistory:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._in_order: deque[float] = deque()
        self.sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._in_order)

    def add(self, seconds: float) -> None:
        self._in_order.append(seconds)
        bisect.insort(self.sorted, seconds)
        if len(self._in_order) > self.limit:
            oldest = self._in_order.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, oldest)]

    def cdf(self, tau: float) -> float:
        """P(duration <= tau)."""
        if not self.sorted:
            return 0.0
        return bisect.bisect_right(self.sorted, tau) / len(self.sorted)


class ToolDurations:
    """Per-tool histories plus one over all tools (the cold-start fallback)."""

    def __init__(self, limit: int, max_tools: int = 1024) -> None:
        self.limit = limit
        self.max_tools = max_tools
        self.all_tools = DurationHistory(limit)
        self._by_tool: dict[str, DurationHistory] = {}
        self.num_samples = 0  # ever recorded, across all tools

    def add(self, tool: str, seconds: float) -> None:
        history = self._by_tool.get(tool)
        if history is None:
            if len(self._by_tool) >= self.max_tools:  # tool names come from outputs
                self._by_tool.pop(next(iter(self._by_tool)))
            history = self._by_tool[tool] = DurationHistory(self.limit)
        history.add(seconds)
        self.all_tools.add(seconds)
        self.num_samples += 1

    def of(self, tool: str) -> DurationHistory | None:
        return self._by_tool.get(tool)

    def tools(self) -> list[str]:
        return list(self._by_tool)


class CallHistory:
    """A program's last `limit` returned tool calls, (tool, seconds). Small, so
    its sorted views are built when read (a decision reads two)."""

    __slots__ = ("_calls",)

    def __init__(self, limit: int = PROGRAM_CALLS) -> None:
        self._calls: deque[tuple[str, float]] = deque(maxlen=limit)

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, tool: str, seconds: float) -> None:
        self._calls.append((tool, seconds))

    def of(self, tool: str) -> list[float]:
        """The durations of its calls of `tool`, sorted."""
        return sorted(seconds for name, seconds in self._calls if name == tool)

    def all(self) -> list[float]:
        """The durations of all its calls, sorted."""
        return sorted(seconds for _, seconds in self._calls)
