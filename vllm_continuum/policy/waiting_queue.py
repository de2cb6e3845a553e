"""The waiting queue, in lanes: preempted work, then turns whose session holds a
pin, then everyone else.

A pinned session's next turn goes first because its prefill is nearly free
and admitting it lets the pin go; making it wait keeps memory idle (the
paper's Algorithm 1). Preempted requests stay ahead of everything, as in
stock vLLM. Within a lane, order is by `key_of(request)` (arrival, or
priority then arrival), so popping and re-adding a skipped request keeps
its place.

It speaks vLLM's `RequestQueue` protocol by duck typing and knows requests
only through the three functions it is given, so it is tested without vLLM.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
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
    ) -> None:
        self._lane_of = lane_of
        self._key_of = key_of
        self._session_of = session_of
        self._preempted: deque[R] = deque()
        self._heaps: dict[int, list[tuple[tuple, R]]] = {PINNED: [], REGULAR: []}
        self._waiting_sessions: Counter[Hashable] = Counter()
        self._size = 0  # vLLM asks len() several times per step: keep it O(1)

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
        if self._preempted:
            return self._preempted[0]
        for lane in (PINNED, REGULAR):
            if self._heaps[lane]:
                return self._heaps[lane][0][1]
        raise IndexError("peek from an empty queue")

    def pop_request(self) -> R:
        if self._preempted:
            request = self._preempted.popleft()
        else:
            heap = self._heaps[PINNED] or self._heaps[REGULAR]
            if not heap:
                raise IndexError("pop from an empty queue")
            request = heapq.heappop(heap)[1]
        self._forget_session(request)
        self._size -= 1
        return request

    def remove_request(self, request: R) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[R]) -> None:
        doomed = {id(r): r for r in requests}
        if not doomed:
            return
        # vLLM also asks to remove requests that sit in its other queue:
        # only those actually found here are forgotten.
        removed = [r for r in self._preempted if id(r) in doomed]
        if removed:
            self._preempted = deque(r for r in self._preempted if id(r) not in doomed)
        for lane, heap in self._heaps.items():
            entries = [e for e in heap if id(e[1]) not in doomed]
            if len(entries) != len(heap):
                removed.extend(e[1] for e in heap if id(e[1]) in doomed)
                heapq.heapify(entries)
                self._heaps[lane] = entries
        for request in removed:
            self._forget_session(request)
        self._size -= len(removed)

    def __bool__(self) -> bool:
        return self._size > 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[R]:
        yield from list(self._preempted)
        for lane in (PINNED, REGULAR):
            yield from (r for _, r in sorted(self._heaps[lane], key=lambda e: e[0]))

    # --- what the scheduler asks besides ---------------------------------
    def has_session_waiting(self, session: Hashable | None) -> bool:
        return session is not None and self._waiting_sessions[session] > 0

    def reclassify(self, session: Hashable) -> None:
        """A pin of `session` appeared or went: move its waiting turns to their lane."""
        if not self.has_session_waiting(session):
            return
        movers = [
            r
            for heap in self._heaps.values()
            for _, r in heap
            if self._session_of(r) == session
        ]
        self.remove_requests(movers)
        for request in movers:
            self.add_request(request)

    # --- internals ---------------------------------------------------------
    def _insert(self, request: R, front: bool) -> None:
        lane = self._lane_of(request)
        if lane == PREEMPTED:
            (self._preempted.appendleft if front else self._preempted.append)(request)
        else:
            heapq.heappush(self._heaps[lane], (self._key_of(request), request))
        self._size += 1
        session = self._session_of(request)
        if session is not None:
            self._waiting_sessions[session] += 1

    def _forget_session(self, request: R) -> None:
        session = self._session_of(request)
        if session is not None:
            self._waiting_sessions[session] -= 1
            if self._waiting_sessions[session] <= 0:
                del self._waiting_sessions[session]
