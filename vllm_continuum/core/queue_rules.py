"""Who goes first among waiting requests: the lanes, the key within a lane,
and who is overdue or entitled to pinned memory.

The waiting queue (`waiting_queue.py`) holds the requests and keeps its head
stable within a step; these rules say where each request belongs in it:

- its lane: a preempted request first (it has lost its KV once), then a turn
  whose context a pin holds (admitting it frees nothing and prefills
  little), then the rest;
- its key in the lane (`queue_order`): by its program's first arrival, then
  its own (`program_fcfs`, the paper's); the same with requests without a
  session before every session's (`sessionless_first`, what ships); by its
  own arrival only (`pinned_fcfs`). The program's arrival is program_order.py's:
  a program past its precedence queues by its turns' own arrival;
- overdue: its extra wait lasted its bound (waiting_bound.py): the waiting
  bound `max_queue_delay_s` of a request without a session (under program
  admission; every request's under request admission), after which it goes
  first and pins give way; or the turn bound `max_turn_delay_s` of a
  session's turn, whose extra wait begins when pins of later programs hold
  memory it needs (or a later program's turn is admitted from the regular
  lane, as when a program lost its precedence), after which it goes before
  every later program's request and their pins give way to it. Later
  programs' turns that continue their own pinned context (the pinned lane)
  do not start it: letting them through is the paper's Algorithm 1, and
  their pins are what the bound watches;
- aged: a session's turn has been passed by requests without a session that
  arrived after it (`sessionless_first` puts them first) for
  `max_turn_aging_s`: it goes before those that arrived after it and are not
  overdue themselves. A turn that reaches the head this way and waits for
  earlier programs' pins waits as it would without them: its aging restarts;
- entitled: its demand is a pin's cost (`pin_cost: pressure`), and a pin past
  its contested TTL gives way to it: a preempted request, or a waiting one
  with the bound.

Every time is the controller's step clock (`now`): within a scheduling step,
the time the step began, so that nothing here changes between vLLM's peek at
the queue's head and its pop.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from vllm_continuum.config import ContinuumConfig
from vllm_continuum.core.pin_table import Pin, PinTable
from vllm_continuum.core.program_order import ProgramOrder
from vllm_continuum.core.sessions import session_key
from vllm_continuum.core.turn import Turn, TurnRequest
from vllm_continuum.core.waiting_bound import WaitingBound, anyone_overdue
from vllm_continuum.core.waiting_queue import (
    AGING,
    PINNED,
    PREEMPTED,
    REGULAR,
    TURN_BOUND,
    WAITING_BOUND,
    LaneQueue,
)


class QueueRules:
    def __init__(self, config: ContinuumConfig, *, turns: dict[str, Turn], pins: PinTable,
                 order: ProgramOrder, level: Callable[[TurnRequest], int], now: Callable[[], float],
                 preempted_status: object, requeue: Callable[[TurnRequest], None]) -> None:
        """`config`: the queue order and the three bounds (`max_queue_delay_s`,
        `max_turn_delay_s`, `max_turn_aging_s`); `turns`: the controller's turns
        by request id (shared, not copied);
        `level`: a request's priority level (0 for all without priority
        scheduling); `requeue`: a queued request's place changed (applied once
        the step is over)."""
        # The order, resolved once: by program arrival (else the request's own),
        # and requests without a session first.
        self._by_program = config.queue_order != "pinned_fcfs"
        self._sessionless_first = config.queue_order == "sessionless_first"
        self.turns, self.pins, self.order = turns, pins, order
        self.bound = WaitingBound(config.max_queue_delay_s)  # keyed by arrival
        self.turn_bound = WaitingBound(config.max_turn_delay_s)  # keyed by place (program arrival)
        self.aging = WaitingBound(config.max_turn_aging_s)  # keyed by where a turn's aging counts from
        self._bounds = {WAITING_BOUND: self.bound, TURN_BOUND: self.turn_bound, AGING: self.aging}
        self._bounds_on = tuple(b for b in self._bounds.values() if not b.off)  # (off: never due)
        self.level, self.now = level, now
        self._preempted = preempted_status
        self._requeue = requeue

    def lane_queue(self, queue_cls: type[LaneQueue] = LaneQueue) -> LaneQueue:
        """Program-level FCFS with a pinned lane and the two bounds.
        `queue_cls`: LaneQueue or a subclass (the adapter's is also vLLM's
        RequestQueue)."""
        return queue_cls(
            lane_of=self.lane_of,
            key_of=self.queue_key,
            enqueued_at=self.arrival,
            overdue=self.overdue,
            priority_of=self.level,
            has_waiting_bound=self.has_waiting_bound,
            place_of=self.place,
            aging_from=self.aging_from,
            aged=self.aged,
            turn_bounds=(not self.turn_bound.off, not self.aging.off),
            none_due=self.none_due,
            on_empty=self.nobody_waits,
        )

    def lane_of(self, request: TurnRequest) -> int:
        if request.status == self._preempted:
            return PREEMPTED
        turn = self.turns.get(request.request_id)
        pinned = turn is not None and turn.pin is not None and self.pins.holds(turn.pin)
        return PINNED if pinned else REGULAR

    def arrival(self, request: TurnRequest) -> float:
        turn = self.turns.get(request.request_id)
        return turn.arrival if turn is not None else self.now()

    def aging_from(self, request: TurnRequest) -> float:
        turn = self.turns.get(request.request_id)
        if turn is None:
            return self.now()
        return turn.aging_from if turn.aging_from is not None else turn.arrival

    def place(self, request: TurnRequest) -> float:
        """Its place among programs: its program's first arrival while the
        program has precedence, then its own arrival (program_order.py)."""
        turn = self.turns.get(request.request_id)
        if turn is None:
            return self.now()
        return self.order.place(turn.program_arrival, turn.arrival, self.now())

    def queue_key(self, request: TurnRequest) -> tuple:
        """The last lane's order: by the program's rank (`program_order: service`:
        its service level, the least first; else all 0), then its first arrival,
        then the request's (`pinned_fcfs`: the request's only);
        `sessionless_first` puts requests without a session before every
        session's."""
        turn = self.turns.get(request.request_id)
        arrival, seq = (turn.arrival, turn.seq) if turn is not None else (self.now(), -1)
        program = self.place(request) if self._by_program else arrival
        session_last = self._sessionless_first and self.session(request) is not None
        rank = turn.rank if turn is not None else 0
        return (session_last, rank, program, arrival, seq, request.request_id)

    def has_waiting_bound(self, request: TurnRequest) -> bool:
        """Whether it has the waiting bound (else the turn bound): program_order.py."""
        return self.order.has_waiting_bound(self.session(request))

    def session(self, request: TurnRequest) -> str | None:
        """Its session's key, as computed once at arrival (`Turn.session`)."""
        turn = self.turns.get(request.request_id)
        return turn.session if turn is not None else session_key(request.session_id)

    def entitled(self, request: TurnRequest) -> bool:
        """Whether its demand is a pin's cost: it may take pinned memory (a
        preempted request always; under program admission a waiting one only if
        it has the waiting bound, program_order.py)."""
        return request.status == self._preempted or self.has_waiting_bound(request)

    def overdue(self, request: TurnRequest) -> bool:
        """Its extra wait lasted its bound: with the waiting bound, it goes first
        and pins give way; with the turn bound, it goes before later programs'
        requests and their pins give way (`turn_overdue`)."""
        if self.has_waiting_bound(request):
            return self.bound.overdue(self.arrival(request), self.level(request), self.now())
        return self.turn_overdue(request)

    def turn_overdue(self, request: TurnRequest) -> bool:
        # An infinite bound (the default) is never passed: nothing to look up.
        return (not self.turn_bound.off and not self.has_waiting_bound(request)
                and self.turn_bound.overdue(self.place(request), self.level(request), self.now()))

    def aged(self, request: TurnRequest) -> bool:
        """Later requests without a session have gone ahead of this turn for its bound."""
        return (not self.aging.off and not self.has_waiting_bound(request)
                and self.aging.overdue(self.aging_from(request), self.level(request), self.now()))

    def none_due(self, bound: int | None, level: int) -> bool:
        """No request of the level waiting under `bound` (waiting_queue.py's
        WAITING_BOUND, TURN_BOUND, AGING; None: any of them) can be overdue
        (resp. aged) now: the queue's O(1) shortcut past `overdue` and `aged`.
        A request waits under the waiting bound iff `has_waiting_bound`, so each
        of those reads only its own bound's marks."""
        if bound is not None:
            return not self._bounds[bound].anyone_overdue(level, self.now())
        return not anyone_overdue(self._bounds_on, level, self.now())

    def went_ahead(self, request: TurnRequest, turn: Turn | None = None) -> None:
        """It was admitted: every waiting request it passed starts its extra wait
        (a turn that continued its pinned context starts no turn's). `turn`: its
        turn, if the caller has it (else looked up)."""
        if turn is None:
            turn = self.turns.get(request.request_id)
        level, now = self.level(request), self.now()
        arrival = turn.arrival if turn is not None else now
        self.bound.went_ahead(arrival, level, now)
        session = turn.session if turn is not None else session_key(request.session_id)
        if self.order.has_waiting_bound(session):
            if not self.aging.off:  # an infinite bound's marks are never read
                self.aging.went_ahead(arrival, level, now)
        elif not self.turn_bound.off:
            place = self.order.place(turn.program_arrival, turn.arrival, now) if turn is not None else now
            self.turn_bound.went_ahead(place, level, now)

    def waits_for_earlier_programs(self, request: TurnRequest) -> None:
        """An aged turn at the head waits for earlier programs' pins: that wait is
        not the sessionless requests', so its aging restarts."""
        turn = self.turns.get(request.request_id)
        if turn is not None:
            turn.aging_from = self.now()
            self._requeue(request)

    def held_by_later_pins(self, request: TurnRequest) -> None:
        """Pins of programs that arrived after its own kept memory it needed:
        it (and every turn of an earlier program) is passed now."""
        key = math.nextafter(self.place(request), math.inf)
        self.turn_bound.went_ahead(key, self.level(request), self.now())

    def prune(self, first_of: Callable[[int, int], float | None] | None) -> None:
        """The bounds forget what nobody waiting can be passed by: `first_of(bound,
        level)`, where the first request waiting under a bound (WAITING_BOUND,
        TURN_BOUND, AGING) at a priority level stands (None: nobody);
        `first_of=None`: nobody waits at all. Only the levels marked since the
        last prune are read."""
        for index, bound in self._bounds.items():
            if first_of is None:
                bound.clear()
            else:
                bound.prune(lambda level, index=index: first_of(index, level))

    def nobody_waits(self, bound: int, level: int) -> None:
        """The last request waiting under `bound` at `level` left: its marks go
        (priority levels are the clients' choice: none is kept without need)."""
        self._bounds[bound].forget_level(level)

    def later_program(self, request: TurnRequest) -> Callable[[Pin], bool]:
        """Whether a pin belongs to a program that arrived after the request's."""
        program = self.place(request)
        return lambda pin: pin.program_arrival > program


def _continued_its_pin(turn: Turn | None) -> bool:
    """An admitted turn that found its context pinned."""
    return turn is not None and turn.resuming is not None and turn.resuming[0]
