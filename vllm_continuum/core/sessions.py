"""What the scheduler remembers about each session (agent program).

- its first arrival: programs are served first-come-first-served, and under
  pressure the pins of the programs that arrived last go first;
- when its last turn ended, which tool that turn called, and the prefix the
  next turn must continue (an `Anchor`): the next turn's arrival then
  measures the tool's duration, as the paper does;
- how many turns it has had: when the program ends (a last-turn hint, or
  idle past a horizon) that count feeds eta.

Session ids come from clients, so the table is bounded, and a request only
counts as the session's next turn if its prompt continues the last turn's
context: a request that merely carries the id neither inherits the program's
place in the queue nor records a tool duration.

The bound is a segmented LRU: sessions that never finished a turn (a flood
of fresh ids, each aborted at once, costs its sender nothing) are forgotten
first, then sessions whose last turn answered (a flood of cheap one-token
turns), and last the paused agents, whose last turn called a tool, least
recently active first in each segment. So neither flood can push an agent
that waits for its tool out of the table; only more paused agents can. What the
table still forgets, a live pin remembers (the controller asks the pins
first: `PinController.on_arrival`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
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
    program_arrival: float  # controller clock, as every time here
    last_seen: float
    turns: int = 0
    last_end: float | None = None  # when the last turn ended
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
        # Oldest activity first in each: sessions without a finished turn, and with one.
        # Oldest activity first in each; forgotten in this order of tables:
        # never finished a turn, last turn answered, last turn called a tool
        # (a paused agent, whose next turn is due).
        self._new: OrderedDict[str, SessionState] = OrderedDict()
        self._known: OrderedDict[str, SessionState] = OrderedDict()
        self._paused: OrderedDict[str, SessionState] = OrderedDict()
        self._tables = (self._new, self._known, self._paused)

    def __len__(self) -> int:
        return sum(map(len, self._tables))

    def __contains__(self, session_id: object) -> bool:
        return any(session_id in table for table in self._tables)

    def get(self, session_id: str) -> SessionState | None:
        return self._table_of(session_id).get(session_id)

    def program_arrival(self, session_id: str | None, default: float) -> float:
        state = self.get(session_id) if session_id is not None else None
        return state.program_arrival if state is not None else default

    def observe_arrival(self, session_id: str, now: float, hashes: Sequence[Hashable],
                        arrival: float | None = None) -> Arrival:
        """Record a new request of the session, seen now (it arrived at
        `arrival`, default now), whose prompt has these block hashes. O(1)."""
        state = self._touch(session_id, now)
        if state is None:
            if len(self) >= self.max_sessions:
                next(table for table in self._tables if table).popitem(last=False)
            state = self._new[session_id] = SessionState(now if arrival is None else arrival, now)
            return Arrival(state, continues=False, first_turn=True)
        anchor = state.last_anchor
        if anchor is None or not anchor.continued_by(hashes):
            return Arrival(state, continues=False, first_turn=state.turns == 0)
        measured = None
        if state.last_tool is not None and state.last_end is not None:
            measured = (state.last_tool, max(0.0, now - state.last_end))
            state.last_tool = None
        return Arrival(state, continues=True, first_turn=False, measured=measured)

    def observe_turn_end(
        self, session_id: str, now: float, tool: str | None, anchor: Anchor | None
    ) -> None:
        table, state = self._find(session_id)
        if state is not None:
            # It did real work: out of a flood's reach; paused agents last of all.
            # Either way it is now the most recently active of its table.
            state.last_seen = now
            to = self._paused if tool is not None else self._known
            if table is to:
                table.move_to_end(session_id)
            else:
                del table[session_id]
                to[session_id] = state
            state.turns += 1
            state.last_end = now
            state.last_tool = tool
            state.last_anchor = anchor

    def adopt(self, session_id: str, program_arrival: float, anchor: Anchor | None) -> None:
        """The table had forgotten a session whose pinned context a new request
        continues: restore what the pin knows (its program's first arrival and
        the prefix), so that the session's next turns continue it. Its number
        of turns so far is lost (counted from 1)."""
        state = self.get(session_id)
        if state is None:
            return
        state.program_arrival = min(state.program_arrival, program_arrival)
        state.last_anchor, state.last_tool = anchor, None
        state.turns = max(state.turns, 1)
        self._move(session_id, self._paused)

    def end_program(self, session_id: str) -> int:
        """Forget a finished program; return its number of turns (0 if unknown)."""
        state = self._table_of(session_id).pop(session_id, None)
        return state.turns if state is not None else 0

    def pop_idle(
        self, now: float, horizon_s: float, busy: Callable[[str], bool] = lambda s: False
    ) -> list[tuple[str, int]]:
        """Programs idle past the horizon count as finished: (session, turns).
        A `busy` session (one whose context is pinned: its tool is running) is
        not idle: it counts as seen now. O(1) when nobody is idle, else
        O(sessions that leave or are found busy): each table is in order of
        last activity, and only its head is read."""
        ended = []
        for table in self._tables:
            while table:
                session_id = next(iter(table))
                state = table[session_id]
                if now - state.last_seen < horizon_s:
                    break
                if busy(session_id):
                    state.last_seen = now
                    table.move_to_end(session_id)
                else:
                    del table[session_id]
                    ended.append((session_id, state.turns))
        return ended

    def _find(self, session_id: str) -> tuple[OrderedDict[str, SessionState] | None, SessionState | None]:
        """(the table holding the session, its state), or (None, None)."""
        for table in self._tables:
            state = table.get(session_id)
            if state is not None:
                return table, state
        return None, None

    def _touch(self, session_id: str, now: float) -> SessionState | None:
        table, state = self._find(session_id)
        if state is not None:
            state.last_seen = now
            table.move_to_end(session_id)
        return state

    def _table_of(self, session_id: str) -> OrderedDict[str, SessionState]:
        return next((table for table in self._tables if session_id in table), self._new)

    def _move(self, session_id: str, to: OrderedDict[str, SessionState]) -> None:
        table = self._table_of(session_id)
        if table is not to and session_id in table:
            to[session_id] = table.pop(session_id)
