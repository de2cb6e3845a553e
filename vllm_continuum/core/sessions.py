"""What the scheduler remembers about each session (agent program).

- its first arrival: programs are served first-come-first-served, and under
  pressure the pins of the programs that arrived last go first;
- when its last turn ended, which tool that turn called, and the prefix the
  next turn must continue (an `Anchor`): the next turn's arrival then
  measures the tool's duration, as the paper does;
- how many turns it has had: when the program ends (a last-turn hint, or
  idle past a horizon) that count feeds eta.

Session ids come from clients, so the table is bounded (the least recently
active sessions are forgotten first), and a request only counts as the
session's next turn if its prompt continues the last turn's context: a
request that merely carries the id neither inherits the program's place in
the queue nor records a tool duration.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from vllm_continuum.core.pin_table import Anchor

_MAX_SESSION_KEY_LENGTH = 128


def session_key(session_id: str | None) -> str | None:
    """The session a request belongs to (vLLM's `session_id`), as pins key it.

    Client-chosen ids can be huge; long ones are kept as a fixed-size digest.
    """
    if not session_id or len(session_id) <= _MAX_SESSION_KEY_LENGTH:
        return session_id or None
    return "sha256:" + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class SessionState:
    first_arrival: float  # the request's arrival_time: comparable across sessions
    last_seen: float  # scheduler clock
    turns: int = 0
    last_end: float | None = None  # scheduler clock, when the last turn ended
    last_tool: str | None = None  # tool the last turn called, until measured
    last_anchor: Anchor | None = None  # the prefix the next turn continues


@dataclass(frozen=True)
class Arrival:
    """What a new request of a session is to it."""

    state: SessionState
    continues: bool  # its prompt continues the session's last turn
    first_turn: bool  # no turn of the session had ended before it
    measured: tuple[str, float] | None = None  # (tool, duration) of the last turn's call


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
        self, session_id: str, arrival: float, now: float, hashes: Sequence[Hashable]
    ) -> Arrival:
        """Record a new request of the session, whose prompt has these block hashes."""
        state = self._touch(session_id, now)
        if state is None:
            state = self._sessions[session_id] = SessionState(arrival, now)
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
            return Arrival(state, continues=False, first_turn=True)
        anchor = state.last_anchor
        if anchor is None or not anchor.continued_by(hashes):
            return Arrival(state, continues=False, first_turn=state.turns == 0)
        state.first_arrival = min(state.first_arrival, arrival)
        measured = None
        if state.last_tool is not None and state.last_end is not None:
            measured = (state.last_tool, max(0.0, now - state.last_end))
            state.last_tool = None
        return Arrival(state, continues=True, first_turn=False, measured=measured)

    def observe_turn_end(
        self, session_id: str, now: float, tool: str | None, anchor: Anchor | None
    ) -> None:
        state = self._touch(session_id, now)
        if state is not None:
            state.turns += 1
            state.last_end = now
            state.last_tool = tool
            state.last_anchor = anchor

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
