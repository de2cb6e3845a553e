"""The waiting queue of program-level FCFS, in lanes, with a waiting bound.

Order, within one priority level (`--scheduling-policy priority` keeps
vLLM's priority first: the lanes only order requests of equal priority):

1. preempted requests, front to back as vLLM puts them back (as stock);
2. the oldest waiting request that has a waiting bound (`bounded`: under
   program admission, requests without a session), once it is overdue
   (`waiting_bound.py`): from then on no request that arrived after it goes
   first;
3. turns that continue a pinned context: their prefill is nearly free and
   admitting them lets the pin go (the paper's Algorithm 1);
4. everything else by `key_of` (program-level FCFS: the program's first
   arrival, then the request's).

vLLM stops admitting at the first request that does not fit, so whatever
is first blocks everything behind it: that is why an overdue request must
be first. Popping and re-adding a skipped request keeps its place (keys and
enqueue times do not change). Of all waiting requests the oldest is always
the first to be passed, so checking it alone finds any overdue one.

vLLM peeks at the head, works on that request (prefix lookup, connector
query, allocation: time passes, its status may change), then pops, and
assumes the pop returns what it peeked. So a pop returns the request the
last peek returned whenever nothing was pushed or removed in between,
whatever the order says by then. (The controller also reads the clock once
per scheduling step, so within a step the order does not drift either.)

It speaks vLLM's `RequestQueue` protocol by duck typing and knows requests
only through the functions it is given, so it is tested without vLLM.
Removal is lazy (a heap entry is valid while its token is current), so
every operation but `remove_requests` of many is O(log n).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Generic, TypeVar

R = TypeVar("R")

PREEMPTED, PINNED, REGULAR = 0, 1, 2


class LaneQueue(Generic[R]):
    def __init__(
        self,
        lane_of: Callable[[R], int],
        key_of: Callable[[R], tuple],
        session_of: Callable[[R], Hashable | None],
        *,
        enqueued_at: Callable[[R], float] = lambda r: 0.0,
        overdue: Callable[[R], bool] = lambda r: False,
        priority_of: Callable[[R], int] = lambda r: 0,
        bounded: Callable[[R], bool] = lambda r: True,
    ) -> None:
        """`bounded`: whether a request has the waiting bound (only those are
        watched for being overdue: `overdue` is asked about the oldest of them)."""
        self._lane_of = lane_of
        self._key_of = key_of
        self._session_of = session_of
        self._enqueued_at = enqueued_at
        self._overdue = overdue
        self._priority_of = priority_of
        self._bounded = bounded
        self._tokens = itertools.count()
        self._ends = itertools.count(1)  # preempted lane: prepend < 0 < append
        self._members: dict[int, tuple[int, R, bool]] = {}  # id -> (token, request, aged?)
        self._aged = 0  # members in the aging heaps
        self._heap: list[tuple[tuple, int, R]] = []
        # Per priority level: (enqueue time, token, request) of non-preempted requests.
        self._aging: dict[int, list[tuple[float, int, R]]] = {}
        self._waiting_sessions: Counter[Hashable] = Counter()
        self._peeked: R | None = None  # what the last peek returned, until a push or pop

    # --- vLLM RequestQueue protocol -------------------------------------
    def add_request(self, request: R) -> None:
        self._insert(request, front=False)

    def prepend_request(self, request: R) -> None:
        self._insert(request, front=True)

    def prepend_requests(self, requests: Iterable[R]) -> None:
        # Same order semantics as vLLM's FCFS deque.extendleft.
        for request in requests:
            self._insert(request, front=True)

    def peek_request(self) -> R:
        self._peeked = self._head()[2]
        return self._peeked

    def pop_request(self) -> R:
        request = self._peeked if self._peeked is not None else self._head()[2]
        self._forget(request)
        self._compact()
        return request

    def remove_request(self, request: R) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[R]) -> None:
        # vLLM also asks to remove requests that sit in its other queue:
        # only those actually found here are forgotten.
        for request in requests:
            if id(request) in self._members:
                self._forget(request)
        self._compact()

    def __bool__(self) -> bool:
        return bool(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[R]:
        return iter(self._ordered())

    # vLLM's FCFS queue is a deque: code around the scheduler reads it by index.
    def __getitem__(self, index: int) -> R:
        return self._ordered()[index]

    def __contains__(self, request: object) -> bool:
        return id(request) in self._members and self._members[id(request)][1] is request

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._ordered()!r})"

    # --- what the scheduler asks besides ---------------------------------
    def has_session_waiting(self, session: Hashable | None) -> bool:
        return session is not None and self._waiting_sessions[session] > 0

    def reclassify(self, session: Hashable) -> None:
        """A pin of `session` appeared or went: move its waiting turns to their lane."""
        if not self.has_session_waiting(session):
            return
        movers = [r for _, r, _ in self._members.values() if self._session_of(r) == session]
        for request in movers:
            self._forget(request)
            self._insert(request, front=False)

    def oldest_enqueued_at(self) -> float | None:
        """Enqueue time of the longest-waiting bounded request that is not preempted."""
        oldest = [self._oldest(priority) for priority in self._aging]
        times = [self._enqueued_at(r) for r in oldest if r is not None]
        return min(times) if times else None

    # --- internals ---------------------------------------------------------
    def _ordered(self) -> list[R]:
        """Every request, in the order pops would return them now. O(n log n)."""
        live = sorted(e for e in self._heap if self._valid(e[1], e[2]))
        overdue = self._overdue_head(live[0][0][0]) if live else None
        if overdue is None or live[0][0][1] == PREEMPTED:
            return [r for _, _, r in live]
        return [overdue, *(r for _, _, r in live if r is not overdue)]

    def _insert(self, request: R, front: bool) -> None:
        self._peeked = None
        token = next(self._tokens)
        lane = self._lane_of(request)
        aged = lane != PREEMPTED and self._bounded(request)
        self._members[id(request)] = (token, request, aged)
        priority = self._priority_of(request)
        if lane == PREEMPTED:
            end = next(self._ends)
            key = (priority, PREEMPTED, (-end if front else end,))
        else:
            key = (priority, lane, self._key_of(request))
            if aged:
                aging = self._aging.setdefault(priority, [])
                heapq.heappush(aging, (self._enqueued_at(request), token, request))
                self._aged += 1
        heapq.heappush(self._heap, (key, token, request))
        session = self._session_of(request)
        if session is not None:
            self._waiting_sessions[session] += 1

    def _forget(self, request: R) -> None:
        self._peeked = None
        self._aged -= self._members.pop(id(request))[2]
        session = self._session_of(request)
        if session is not None:
            self._waiting_sessions[session] -= 1
            if self._waiting_sessions[session] <= 0:
                del self._waiting_sessions[session]

    def _valid(self, token: int, request: R) -> bool:
        member = self._members.get(id(request))
        return member is not None and member[0] == token

    def _head(self) -> tuple[tuple, int, R]:
        heap = self._heap
        while heap and not self._valid(heap[0][1], heap[0][2]):
            heapq.heappop(heap)
        if not heap:
            raise IndexError("peek from an empty queue")
        top = heap[0]
        (priority, lane, _), _, _ = top
        if lane != PREEMPTED:
            overdue = self._overdue_head(priority)
            if overdue is not None:
                return (top[0], self._members[id(overdue)][0], overdue)
        return top

    def _oldest(self, priority: int) -> R | None:
        aging = self._aging.get(priority)
        while aging and not self._valid(aging[0][1], aging[0][2]):
            heapq.heappop(aging)
        return aging[0][2] if aging else None

    def _overdue_head(self, priority: int) -> R | None:
        """The oldest request of this priority level, if it is overdue."""
        oldest = self._oldest(priority)
        return oldest if oldest is not None and self._overdue(oldest) else None

    def _compact(self) -> None:
        """Drop stale entries once they outnumber the live ones."""
        stale = len(self._heap) + sum(map(len, self._aging.values())) - len(self._members) - self._aged
        if stale > len(self._members) + 64:
            self._heap = [e for e in self._heap if self._valid(e[1], e[2])]
            heapq.heapify(self._heap)
            for priority, aging in list(self._aging.items()):
                kept = [e for e in aging if self._valid(e[1], e[2])]
                if kept:
                    heapq.heapify(kept)
                    self._aging[priority] = kept
                else:
                    del self._aging[priority]
