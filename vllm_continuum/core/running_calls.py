"""Tool calls in flight, and what the ones still out past the cap say.

A tool's duration is recorded when its call returns (the next turn arrives),
so a slow tool's first calls say nothing until minutes later, while its
pins are being decided. A call still out `overdue_after_s` after its turn
ended (the cap plus the late-return margin) is already known to outlast
the cap: a right-censored duration, which the retention rule counts as a
sample beyond any horizon (`hazard_ttl.py`). It counts until the call
returns (then its real duration is recorded in its place) or until
`forget_after_s` passes (the program has ended; it never returns). At most
`max_calls` are kept (session ids come from clients): past it the oldest
call is forgotten.

Calls are kept in the order they started, so each event costs O(1)
amortised: `advance` only reads the head of two queues.
"""

from __future__ import annotations

import math
from collections import deque

LATE_RETURN_S = 0.5  # a call that returns this soon after the cap returned in time


class _Call:
    __slots__ = ("tool", "started", "overdue")

    def __init__(self, tool: str, started: float) -> None:
        self.tool, self.started, self.overdue = tool, started, False


class RunningCalls:
    """Each session's running tool call, and per tool the calls out past
    `overdue_after_s` (`inf`: nothing is tracked, each event is a no-op)."""

    def __init__(self, overdue_after_s: float, forget_after_s: float,
                 max_calls: int = 1_000_000) -> None:
        self.overdue_after_s = overdue_after_s
        self.max_calls = max_calls
        self._tracking = math.isfinite(overdue_after_s)
        self.forget_after_s = max(forget_after_s, overdue_after_s)
        self._running: dict[str, _Call] = {}  # session -> its call, until it returns
        self._started: deque[tuple[str, _Call]] = deque()  # not yet overdue, in start order
        self._late: deque[tuple[str, _Call]] = deque()  # overdue, in start order
        self._overdue_of: dict[str, int] = {}
        self.num_overdue = 0

    def __len__(self) -> int:
        return len(self._running)

    def start(self, session: str, tool: str, now: float) -> None:
        """The session's turn ended in a call of `tool` (any call it had running
        is superseded)."""
        if not self._tracking:
            return
        self.returned(session)
        call = self._running[session] = _Call(tool, now)
        self._started.append((session, call))
        self.advance(now)
        while len(self._running) > self.max_calls:  # the oldest first: overdue, then the rest
            gone, oldest = (self._late or self._started).popleft()
            if self._running.get(gone) is oldest:
                self.returned(gone)

    def returned(self, session: str) -> None:
        """The session's call returned (or will not be waited for)."""
        call = self._running.pop(session, None)
        if call is not None and call.overdue:
            self._count(call.tool, -1)

    def overdue(self, tool: str) -> int:
        """The calls of `tool` out past `overdue_after_s`, as of the last `advance`."""
        return self._overdue_of.get(tool, 0)

    def advance(self, now: float) -> None:
        """Move the calls that have run past `overdue_after_s` (and those past
        `forget_after_s`) on, as of `now`."""
        started, late = self._started, self._late
        while started and now - started[0][1].started >= self.overdue_after_s:
            session, call = started.popleft()
            if self._running.get(session) is call:
                call.overdue = True
                self._count(call.tool, 1)
                late.append((session, call))
        while late and now - late[0][1].started >= self.forget_after_s:
            session, call = late.popleft()
            if self._running.get(session) is call:
                self.returned(session)

    def _count(self, tool: str, delta: int) -> None:
        n = self._overdue_of.get(tool, 0) + delta
        if n:
            self._overdue_of[tool] = n
        else:
            del self._overdue_of[tool]
        self.num_overdue += delta
