"""What the scheduler remembers about each session (agent program).

- its first arrival: programs are served first-come-first-served, and under
  pressure the pins of the programs that arrived last go first;
- when its last turn ended and which tool that turn called: the next turn's
  arrival then measures the tool's duration, as the paper does;
- how many turns it has had: when the program ends (a last-turn hint, or
  idle past a horizon) that count feeds eta.

Session ids come from clients, so the table is bounded: the least recently
active sessions are forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class SessionState:
    first_arrival: float  # the request's arrival_time: comparable across sessions
    last_seen: float  # scheduler clock
    turns: int = 0
    last_end: float | None = None  # scheduler clock, when the last turn ended
    last_tool: str | None = None  # tool the last turn called, until measured


class SessionRegistry:
    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, SessionState] = OrderedDict()  # oldest activity first

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def get(self, session_id: str) -> SessionState | None:
        return self._sessions.get(session_id)

    def first_arrival(self, session_id: str | None, default: float) -> float:
        state = self._sessions.get(session_id) if session_id is not None else None
        return state.first_arrival if state is not None else default

    def observe_arrival(
        self, session_id: str, arrival: float, now: float
    ) -> tuple[SessionState, tuple[str, float] | None]:
        """Record a new request of the session. Returns its state and, if the
        previous turn called a tool, (tool, measured duration in seconds)."""
        state = self._touch(session_id, now)
        if state is None:
            state = self._sessions[session_id] = SessionState(arrival, now)
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
            return state, None
        state.first_arrival = min(state.first_arrival, arrival)
        measured = None
        if state.last_tool is not None and state.last_end is not None:
            measured = (state.last_tool, max(0.0, now - state.last_end))
            state.last_tool = None
        return state, measured

    def observe_turn_end(self, session_id: str, now: float, tool: str | None) -> None:
        state = self._touch(session_id, now)
        if state is not None:
            state.turns += 1
            state.last_end = now
            state.last_tool = tool

    def end_program(self, session_id: str) -> int:
        """Forget a finished program; return its number of turns (0 if unknown)."""
        state = self._sessions.pop(session_id, None)
        return state.turns if state is not None else 0

    def pop_idle(self, now: float, horizon_s: float) -> list[tuple[str, int]]:
        """Programs idle past the horizon count as finished: (session, turns)."""
        ended = []
        while self._sessions:
            session_id, state = next(iter(self._sessions.items()))
            if now - state.last_seen < horizon_s:
                break
            self._sessions.popitem(last=False)
            ended.append((session_id, state.turns))
        return ended

    def _touch(self, session_id: str, now: float) -> SessionState | None:
        state = self._sessions.get(session_id)
        if state is not None:
            state.last_seen = now
            self._sessions.move_to_end(session_id)
        return state
