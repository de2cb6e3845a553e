"""What the scheduler remembers about each agent program.

A program is one context growing turn by turn under a session id: the
request that opens it, then every request whose prompt continues the
context its last turn left (its `Anchor`). What is kept of it:

- its first arrival: programs are served in arrival order, and under
  pressure the pins of the programs that arrived last go first;
- when its last turn ended, the tool that turn called, and the anchor: the
  next turn's arrival measures the tool's duration, as the paper does;
- its tenant (its first request's `cache_salt`): whose tool statistics
  decide its pins' TTLs (tool_stats.py);
- how many turns it has had (eta, when it ends: a last-turn hint, or idle
  past a horizon), and how many of its requests are queued or running and
  how many pins hold its context (while any is, it is not idle).

Session ids are claims, not credentials: one id may name several programs,
and a request joins only a program whose context it continues. A request
that continues none opens a program of its own, so a stranger who guesses
an id (before or after the victim's first turn ended) cannot take its place
in the queue, end it, or record its tool durations: to the scheduler, only
someone who sends the context itself is that program.

The table is bounded, a segmented LRU forgetting, least recently active
first: programs whose first turn has not ended (a flood of fresh ids, each
aborted at once, costs its sender nothing), then programs gone idle, then
programs whose last turn answered, and last the paused agents, whose last
turn called a tool. A program idle past the horizon (nothing queued,
running or pinned) counts as ended for eta but keeps its place while the
table holds it, so that its next turn still continues it. What the table
forgets, a live pin remembers (`restore`); a turn that ends after its
program was forgotten puts it back.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from vllm_continuum.core.indexes import discard
from vllm_continuum.core.pin_table import Anchor


@dataclass(eq=False, slots=True)
class Program:
    session: str
    arrival: float  # its first request's arrival (controller clock, as every time here)
    last_seen: float
    key: int = 0  # unique, for the tables
    tenant: str | None = None  # its first request's cache_salt (tool_stats.py)
    turns: int = 0  # turns ended since it opened (or last went idle)
    live: int = 0  # its requests queued or running
    pins: int = 0  # pins holding its context
    service: int = 0  # tokens served to it: prefilled (beyond its cache hits) and decoded
    last_end: float | None = None  # when its last turn ended
    last_tool: str | None = None  # the tool its last turn called, until the call returns
    anchor: Anchor | None = None  # the prefix its next turn continues
    table: OrderedDict | None = field(default=None, repr=False)  # the LRU segment holding it

    @property
    def busy(self) -> bool:
        return self.live > 0 or self.pins > 0


class ProgramTable:
    def __init__(self, max_programs: int) -> None:
        self.max_programs = max_programs
        # Segments, in the order they are forgotten; each oldest activity first.
        self._opening: OrderedDict[int, Program] = OrderedDict()  # no turn ended yet
        self._idle: OrderedDict[int, Program] = OrderedDict()  # idle past the horizon
        self._answered: OrderedDict[int, Program] = OrderedDict()  # last turn answered
        self._paused: OrderedDict[int, Program] = OrderedDict()  # last turn called a tool
        self._segments = (self._opening, self._idle, self._answered, self._paused)
        # session -> its programs by key; session -> anchor's last hash -> programs
        self._by_session: dict[str, dict[int, Program]] = {}
        self._anchors: dict[str, dict[Hashable, list[Program]]] = {}
        self._keys = itertools.count(1)

    def __len__(self) -> int:
        return sum(map(len, self._segments))

    def __contains__(self, program: object) -> bool:
        return isinstance(program, Program) and program.table is not None

    def of_session(self, session: str) -> list[Program]:
        return list(self._by_session.get(session, {}).values())

    # --- arrival ------------------------------------------------------------
    def continued_by(self, session: str, hashes: Sequence[Hashable]) -> Program | None:
        """The session's program whose context a prompt with these block hashes
        continues: the longest anchor reached, then the newest program.
        O(min(the prompt's blocks, the session's programs))."""
        by_hash = self._anchors.get(session)
        if not by_hash:
            return None
        programs = self._by_session[session]
        if len(hashes) < len(programs):
            candidates = (p for h in dict.fromkeys(hashes) for p in by_hash.get(h, ()))
        else:
            candidates = programs.values()
        best = None
        for p in candidates:
            if p.anchor is not None and p.anchor.continued_by(hashes) and (
                    best is None or (p.anchor.num_blocks, p.key) > (best.anchor.num_blocks, best.key)):
                best = p
        return best

    def open(self, session: str, now: float, arrival: float, tenant: str | None = None) -> Program:
        """A program opened by a request that continues none of the session's."""
        program = Program(session, arrival, now, key=next(self._keys), tenant=tenant)
        self._insert(program, self._opening)
        return program

    def restore(self, program: Program, now: float) -> Program:
        """A program the table forgot (or had put aside as idle), still known
        to a pin of its context: back in the table."""
        if program.table is None:
            self._insert(program, self._paused if program.anchor is not None else self._opening)
        elif program.table is self._idle:
            self._move(program, self._paused)
        return program

    def arrive(self, program: Program, now: float) -> tuple[str, float] | None:
        """A request of the program arrived: (tool, duration) of the call its
        last turn made, if that call is now known to have returned."""
        program.live += 1
        program.last_seen = now
        if program.table is self._idle:
            self._move(program, self._paused if program.last_tool is not None else self._answered)
        elif program.table is not None:
            program.table.move_to_end(program.key)
        if program.last_tool is None or program.last_end is None:
            return None
        measured = (program.last_tool, max(0.0, now - program.last_end))
        program.last_tool = None
        return measured

    # --- end of a turn ------------------------------------------------------
    def turn_ended(self, program: Program, now: float, tool: str | None, anchor: Anchor | None) -> None:
        """One of its turns ended (with output): `anchor` is what the next turn
        continues. A program the table forgot meanwhile is put back."""
        program.last_seen = program.last_end = now
        program.turns += 1
        program.last_tool = tool
        self._set_anchor(program, anchor)
        to = self._paused if tool is not None else self._answered
        if program.table is None:
            self._insert(program, to)
        elif program.table is to:
            to.move_to_end(program.key)
        else:
            self._move(program, to)

    def left(self, program: Program) -> None:
        """One of its requests left (finished or aborted). A program nobody can
        continue (no turn ended with output) and nothing holds is dropped."""
        program.live -= 1
        if program.anchor is None and not program.busy and program.table is not None:
            self._remove(program)

    def end(self, program: Program) -> int:
        """Its last turn: forget it; its number of turns."""
        if program.table is not None:
            self._remove(program)
        return program.turns

    def pop_idle(self, now: float, horizon_s: float) -> list[int]:
        """Programs idle past the horizon (nothing queued, running or pinned)
        count as ended: their numbers of turns. They stay in the table (first
        to be forgotten) so that a later turn still continues them. A busy
        program counts as seen now. O(1) when nobody is idle, else O(programs
        that leave or are found busy): each segment is in order of last
        activity, and only its head is read."""
        ended = []
        for table in (self._opening, self._answered, self._paused):
            while table:
                program = next(iter(table.values()))
                if now - program.last_seen < horizon_s:
                    break
                if program.busy:
                    program.last_seen = now
                    table.move_to_end(program.key)
                    continue
                ended.append(program.turns)
                program.turns = 0
                if program.anchor is None:
                    self._remove(program)
                else:
                    self._move(program, self._idle)
        return ended

    # --- the tables -----------------------------------------------------------
    def _insert(self, program: Program, table: OrderedDict) -> None:
        if len(self) >= self.max_programs:
            segment = next(t for t in self._segments if t)
            self._remove(next(iter(segment.values())))
        table[program.key] = program
        program.table = table
        self._by_session.setdefault(program.session, {})[program.key] = program
        if program.anchor is not None:
            self._anchors.setdefault(program.session, {}).setdefault(
                program.anchor.last_hash, []).append(program)

    def _remove(self, program: Program) -> None:
        del program.table[program.key]
        program.table = None
        discard(self._by_session, program.session, program.key)
        self._unindex(program)

    def _move(self, program: Program, to: OrderedDict) -> None:
        del program.table[program.key]
        to[program.key] = program
        program.table = to

    def _set_anchor(self, program: Program, anchor: Anchor | None) -> None:
        if program.table is not None:
            self._unindex(program)
        program.anchor = anchor
        if program.table is not None and anchor is not None:
            self._anchors.setdefault(program.session, {}).setdefault(anchor.last_hash, []).append(program)

    def _unindex(self, program: Program) -> None:
        anchor = program.anchor
        by_hash = self._anchors.get(program.session)
        if anchor is None or by_hash is None:
            return
        programs = by_hash.get(anchor.last_hash)
        if programs is not None and program in programs:
            programs.remove(program)
            if not programs:
                del by_hash[anchor.last_hash]
                if not by_hash:
                    del self._anchors[program.session]

