"""Program-level admission: when agents' contexts do not all fit in the KV
pool, programs are served in the order they arrived.

Why: under overload stock vLLM admits every new program, the pool evicts the
contexts of programs paused in tool calls, and every resumed turn prefills
its whole history again (thrashing). Keeping the admitted programs' contexts
(running, or pinned while their tool runs) and letting a new program in only
when they leave room, a program waits longer to be admitted but finishes
sooner, and so does everyone else (docs/results/benchmarks-archive.md). Fairness
is judged by outcome, not by admission delay.

The rules (`admission: program`), read by the controller:

- Requests of a session have the turn bound `max_turn_delay_s` against
  later programs only (queue_rules.py): held back by later programs' pins
  (or regular-lane turns) for that long, a turn goes before them and takes
  their pins; earlier programs it waits for. Against later requests without
  a session it ages for as long (queue_rules.py). A new program's first turn waits
  in program arrival order (program-level FCFS; vLLM admits in queue order
  and stops at the first request that does not fit, so no later program's
  first turn passes it) until the pool has room beside the admitted
  programs' running and pinned blocks: the pool's measured state, nothing to
  tune. A pin holds its memory (under `hold`) while its program makes
  progress: until its next turn, at most its TTL (`max_ttl_s`), its program's
  last turn, or the deadlock guard.
- Requests without a session (one-shots, short) keep the waiting bound
  `max_queue_delay_s` (`has_waiting_bound`): past it they go first and pins give way;
  only their demand, and preempted requests', makes a pin costly (`entitled`).
- An endless session must not starve the rest: a program keeps its
  precedence for `program_precedence_s` from its first arrival; past it,
  its turns queue by their own arrival and its pins give way to any waiting
  request (`lost_precedence`).

So a new program waits for the programs ahead of it, each with finitely many
turns and holding its place while idle for at most `max_ttl_s` per pause, or
at most `program_precedence_s` each; and for later programs at most
`max_turn_delay_s` (docs/guarantees.md). Every time here is the
controller's clock: a program's first arrival is when the scheduler saw it.

Tried and dropped: letting an earlier program's request take a later
program's pinned memory at once (pins holding only against later
programs). It evicts contexts that are about to be reused, and measured
20-25% worse mean JCT under overload in the simulator (docs/results/benchmarks-archive.md);
the turn bound lets it happen only after `max_turn_delay_s`.

`admission: request`: every request has the waiting bound, and its demand
counts against every pin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from vllm_continuum.config import ContinuumConfig
    from vllm_continuum.core.programs import Program

Admission = Literal["program", "request"]
ProgramRank = Literal["arrival", "service"]


# `program_order: service`: a program's level is 0 until it has been served
# anything (a new program's first turn), then 1 + how many times its service
# doubled past SERVICE_BASE tokens, at most SERVICE_LEVELS - 1.
SERVICE_BASE = 4096
SERVICE_LEVELS = 8


@dataclass(frozen=True)
class ProgramOrder:
    admission: Admission = "program"
    precedence_s: float = math.inf
    order: ProgramRank = "arrival"
    levels: int = SERVICE_LEVELS  # `service`: how many levels programs are ranked in
    by_program: bool = field(init=False)  # the admission, resolved once
    by_service: bool = field(init=False)  # the order, resolved once

    def __post_init__(self) -> None:
        if self.admission not in ("program", "request"):
            raise ValueError(f"admission must be 'program' or 'request', not {self.admission!r}")
        if self.order not in ("arrival", "service"):
            raise ValueError(f"program_order must be 'arrival' or 'service', not {self.order!r}")
        object.__setattr__(self, "by_program", self.admission == "program")
        object.__setattr__(self, "by_service", self.by_program and self.order == "service")

    def has_waiting_bound(self, session: str | None) -> bool:
        """Whether a request has the time bound `max_queue_delay_s`, and may
        take pinned memory once it is overdue (and counts as a pin's cost)."""
        return not self.by_program or session is None

    @classmethod
    def of(cls, config: ContinuumConfig) -> ProgramOrder:
        """The order the config names (resolved once, by the controller)."""
        return cls(config.admission, config.program_precedence_s, config.program_order,
                   config.program_service_levels)

    def rank(self, program: Program) -> float:
        """A program's rank among programs, before its place (lower first): 0
        for all under `arrival`; its service level under `service`."""
        if not self.by_service:
            return 0
        return service_level(program.service, self.levels)

    def place(self, program_arrival: float, arrival: float, now: float) -> float:
        """What orders a request among programs: its program's first arrival,
        while the program has precedence; then the request's own arrival."""
        return program_arrival if not self.lost_precedence(program_arrival, now) else arrival

    def lost_precedence(self, program_arrival: float, now: float) -> bool:
        """A program this old no longer holds its place (nor its pins) against others."""
        return self.by_program and now - program_arrival >= self.precedence_s


def service_level(service: int, levels: int = SERVICE_LEVELS) -> int:
    """0 for a program served nothing yet; else 1 + the times its service
    doubled past SERVICE_BASE tokens, at most `levels - 1`. O(1)."""
    if service <= 0:
        return 0
    return min(levels - 1, 1 + max(0, (service // SERVICE_BASE).bit_length()))
