"""Recorded tool durations, per tool and across all tools, as empirical CDFs.

Each history keeps the newest `limit` durations both in arrival order (to
forget the oldest) and sorted (so P(tau) and the TTL arg-max are one pass,
and an insertion is a binary search).
"""

from __future__ import annotations

import bisect
from collections import deque


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
