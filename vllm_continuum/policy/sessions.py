"""When each session (agent program) first arrived.

Program-level order needs it: under pressure the pins of the programs that
arrived last are released first, so early programs finish (the paper's
deadlock guard and FCFS by program). Session ids come from clients, so the
table is bounded (least recently seen sessions are forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict


class SessionRegistry:
    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._first_arrival: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._first_arrival)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._first_arrival

    def observe(self, session_id: str, arrival: float) -> float:
        """Record a request of the session; return the session's first arrival."""
        first = self._first_arrival.pop(session_id, None)
        first = arrival if first is None else min(first, arrival)
        self._first_arrival[session_id] = first
        if len(self._first_arrival) > self.max_sessions:
            self._first_arrival.popitem(last=False)
        return first

    def first_arrival(self, session_id: str, default: float) -> float:
        return self._first_arrival.get(session_id, default)
