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
- overdue: its extra wait lasted the waiting bound (waiting_bound.py), for a
  request that has one (program_order.py): it goes first, and pins give way;
- entitled: its demand is a pin's cost (`pin_cost: pressure`), and a pin past
  its contested TTL gives way to it: a preempted request, or a waiting one
  with the bound.

Every time is the controller's step clock (`now`): within a scheduling step,
the time the step began, so that nothing here changes between vLLM's peek at
the queue's head and its pop.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_continuum.core.pin_table import PinTable
from vllm_continuum.core.program_order import ProgramOrder
from vllm_continuum.core.sessions import session_key
from vllm_continuum.core.turn import Turn, TurnRequest
from vllm_continuum.core.waiting_bound import WaitingBound
from vllm_continuum.core.waiting_queue import PINNED, PREEMPTED, REGULAR, LaneQueue


class QueueRules:
    def __init__(self, *, queue_order: str, pins: PinTable, turns: dict[str, Turn], order: ProgramOrder,
                 bound: WaitingBound, level: Callable[[TurnRequest], int], now: Callable[[], float],
                 preempted_status: object, waiting_status: object) -> None:
        """`turns`: the controller's turns by request id (shared, not copied);
        `level`: a request's priority level (0 for all without priority scheduling)."""
        self.queue_order = queue_order
        self.pins, self.turns, self.order, self.bound = pins, turns, order, bound
        self.level, self.now = level, now
        self._preempted, self._waiting = preempted_status, waiting_status

    def lane_queue(self, queue_cls: type[LaneQueue] = LaneQueue) -> LaneQueue:
        """Program-level FCFS with a pinned lane and the waiting bound.
        `queue_cls`: LaneQueue or a subclass (the adapter's is also vLLM's
        RequestQueue)."""
        return queue_cls(
            lane_of=self.lane_of,
            key_of=self.queue_key,
            session_of=lambda r: session_key(r.session_id),
            enqueued_at=self.enqueued_at,
            overdue=lambda r: r.status == self._waiting and self.overdue(r),
            priority_of=self.level,
            bounded=lambda r: self.order.bounded(session_key(r.session_id)),
        )

    def lane_of(self, request: TurnRequest) -> int:
        if request.status == self._preempted:
            return PREEMPTED
        pinned = self.pins.continued_by(session_key(request.session_id), request.block_hashes)
        return PINNED if pinned is not None else REGULAR

    def program_arrival(self, request: TurnRequest) -> float:
        """When the request's program arrived, as far as order goes (program_order.py)."""
        turn = self.turns.get(request.request_id)
        first = turn.program_arrival if turn is not None else request.arrival_time
        return self.order.program_arrival(first, request.arrival_time, self.now())

    def queue_key(self, request: TurnRequest) -> tuple:
        """The last lane's order: by the program's first arrival, then the request's
        (`pinned_fcfs`: the request's only); `sessionless_first` puts requests
        without a session before every session's."""
        order = self.queue_order
        program = self.program_arrival(request) if order != "pinned_fcfs" else request.arrival_time
        session_last = order == "sessionless_first" and session_key(request.session_id) is not None
        return (session_last, program, request.arrival_time, request.request_id)

    def enqueued_at(self, request: TurnRequest) -> float:
        turn = self.turns.get(request.request_id)
        return turn.enqueued_at if turn is not None else self.now()

    def entitled(self, request: TurnRequest) -> bool:
        """Whether its demand is a pin's cost: it may take pinned memory (a
        preempted request always; under program admission a waiting one only if
        it has the waiting bound, program_order.py)."""
        return request.status == self._preempted or self.order.bounded(session_key(request.session_id))

    def overdue(self, request: TurnRequest) -> bool:
        """Its extra wait lasted the bound (if it has one, program_order.py): it
        goes first, and pins give way to it."""
        turn = self.turns.get(request.request_id)
        return (
            turn is not None
            and self.order.bounded(turn.session)
            and self.bound.overdue(turn.enqueued_at, self.level(request), self.now())
        )
