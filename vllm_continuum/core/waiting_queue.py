"""The waiting queue of program-level FCFS, in lanes, with two time bounds.

Order, within one priority level (`--scheduling-policy priority` keeps
vLLM's priority first: the lanes only order requests of equal priority):

1. preempted requests, front to back as vLLM puts them back (as stock);
2. the first overdue request with the *turn bound* (a session's turn: the
   earliest program's), before every request of a later program
   (`place_of`; a request without a session is a program of its own), and
   only those: a turn waits for the programs ahead of it, and only for them;
3. the oldest overdue request with the *waiting bound* (`has_waiting_bound`: under
   program admission, requests without a session): from then on no request
   that arrived after it goes first, but overdue turns of programs that
   arrived before it;
4. the oldest *aged* turn (`aged`: later requests without a session have
   gone ahead of it for its bound), before requests without a session that
   arrived after it (`aging_from`) and are not overdue themselves;
5. turns that continue a pinned context: their prefill is nearly free and
   admitting them lets the pin go (the paper's Algorithm 1);
6. everything else by `key_of` (program-level FCFS: the program's first
   arrival, then the request's).

vLLM stops admitting at the first request that does not fit, so whatever
is first blocks everything behind it: that is why an overdue request must
be first. Popping and re-adding a skipped request keeps its place (keys and
enqueue times do not change). Each bound (and the aging of turns) keeps its
requests in a heap by the order in which they are passed (`waiting_bound.py`): the first of it is
the first to be overdue, so checking it alone finds any overdue one. A
parked request (grammar compiling, KV loading) may be that first one: vLLM
skips it (pops it and puts it back after the step), and the next peek finds
the next one.

vLLM peeks at the head, works on that request (prefix lookup, connector
query, allocation: time passes, its status may change), then pops, and
assumes the pop returns what it peeked. So a pop returns the request the
last peek returned whenever nothing was pushed or removed in between,
whatever the order says by then. (The controller also reads the clock once
per scheduling step, so within a step the order does not drift either.)

It speaks vLLM's `RequestQueue` protocol by duck typing and knows requests
only through the functions it is given, so it is tested without vLLM.
Removal is lazy (an entry is valid while its token is current): add,
peek, pop, remove one and `requeue` are O(log n) amortized, and O(1) for a
request whose keys come in arrival order (`run_heap.py`: a new program's,
one without a session); reading the queue in order (`__iter__`, indexing)
is O(n log n), and no step does it.
"""

from __future__ import annotations

import itertools
from copy import copy as shallow_copy
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from vllm_continuum.core.run_heap import RunHeap

R = TypeVar("R")

PREEMPTED, PINNED, REGULAR = 0, 1, 2
# The bounds a non-preempted request has: the waiting bound (without a
# session), or the turn bound and aging (a session's turn).
WAITING_BOUND, TURN_BOUND, AGING = 0, 1, 2
_GONE = (-1,)  # the member entry of a request not queued: no token matches it


class LaneQueue(Generic[R]):
    def __init__(
        self,
        lane_of: Callable[[R], int],
        key_of: Callable[[R], tuple],
        *,
        enqueued_at: Callable[[R], float] = lambda r: 0.0,
        overdue: Callable[[R], bool] = lambda r: False,
        priority_of: Callable[[R], int] = lambda r: 0,
        has_waiting_bound: Callable[[R], bool] = lambda r: True,
        place_of: Callable[[R], float] = lambda r: 0.0,
        aging_from: Callable[[R] , float] | None = None,
        aged: Callable[[R], bool] = lambda r: False,
        turn_bounds: tuple[bool, bool] = (True, True),
        none_due: Callable[[int | None, int], bool] = lambda bound, priority: False,
        on_empty: Callable[[int, int], None] = lambda bound, priority: None,
    ) -> None:
        """`key_of`: a request's order in its lane (a tuple, of one length for
        every request); `has_waiting_bound`: whether a request has the
        waiting bound (else it has the turn bound and aging); `place_of`: its program's place in arrival
        order (the turn bound's order); `aging_from`: where a turn's aging
        counts from (default: its enqueue time); `overdue`, `aged`: whether its
        bound, or its aging, has passed (asked only of the first of each to be
        overdue); `turn_bounds`: whether turns can be overdue (the turn bound)
        and aged (aging): the heap of one that is off is not kept;
        `none_due(bound, priority)`: True if no request of that bound
        (WAITING_BOUND, TURN_BOUND: overdue; AGING: aged; None: any of them)
        and level can be due now, so that the head is found without asking
        `overdue` or `aged` of anyone (a shortcut: it must never say True when
        one of them would say True); `on_empty(bound, priority)`: nobody waits
        under that bound at that level any more (its marks can go)."""
        self._lane_of = lane_of
        self._key_of = key_of
        self._enqueued_at = enqueued_at
        self._overdue = overdue
        self._priority_of = priority_of
        self._has_waiting_bound = has_waiting_bound
        self._place_of = place_of
        self._aging_from = aging_from or enqueued_at
        self._aged_out = aged
        self._turn_bounds = turn_bounds
        self._none_due = none_due
        self._on_empty = on_empty
        self._tokens = itertools.count()
        self._ends = itertools.count(1)  # preempted lane: prepend < 0 < append
        self._members: dict[int, tuple[int, R, tuple]] = {}  # id -> (token, request, its bound heaps)
        self._stale = 0  # entries of requests no longer queued (or queued anew)
        # Heap entries are flat tuples, (priority, lane, *key, token, request) and
        # per (bound, priority level) (*age key, token, request) of non-preempted
        # requests (the first is the first to be overdue): the same order as
        # nested keys (a lane's keys have one length), compared several times
        # faster at each push and pop. The token and request are always last.
        self._heap = RunHeap()
        # Per (bound, priority level), its heap and how many queued requests it
        # holds: a family nobody waits in is dropped (clients choose priorities).
        self._aging: dict[tuple[int, int], RunHeap] = {}
        self._family_live: dict[tuple[int, int], int] = {}
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
        self._peeked = self._head()
        return self._peeked

    def pop_request(self) -> R:
        request = self._peeked if self._peeked is not None else self._head()
        self._forget(request)
        self._compact()
        return request

    def remove_request(self, request: R) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[R]) -> None:
        # vLLM also asks to remove requests that sit in its other queue:
        # only those actually found here are forgotten.
        for request in requests:
            if request in self:
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
    def requeue(self, request: R) -> None:
        """Its lane changed (a pin of its context appeared or went): put it
        where it now belongs. O(log n); nothing if it is not queued."""
        if request in self:
            self._forget(request)
            self._insert(request, front=False)

    def first_of(self, bound: int, priority: int) -> float | None:
        """Where the first request waiting under `bound` (WAITING_BOUND: its
        enqueue time; TURN_BOUND: its program's place; AGING: where its aging
        counts from) at this priority level stands; None: nobody. O(1)
        amortized."""
        first = self._first_aged((bound, priority))
        if first is None:
            return None
        return (self._enqueued_at, self._place_of, self._aging_from)[bound](first)

    # --- internals ---------------------------------------------------------
    def _ordered(self) -> list[R]:
        """Every request, in the order pops would return them now (a copy is
        popped). O(n log n): for code that reads the queue, never per step."""
        copy = shallow_copy(self)
        copy._members, copy._heap = dict(self._members), self._heap.copy()
        copy._aging = {k: v.copy() for k, v in self._aging.items()}
        copy._family_live = dict(self._family_live)
        copy._on_empty = lambda bound, priority: None
        copy._peeked = None
        return [copy.pop_request() for _ in range(len(self))]

    def _insert(self, request: R, front: bool) -> None:
        self._peeked = None
        token = next(self._tokens)
        lane = self._lane_of(request)
        priority = self._priority_of(request)
        if lane == PREEMPTED:
            end = next(self._ends)
            key, ages = (priority, PREEMPTED, -end if front else end), []
        else:
            key = (priority, lane, *self._key_of(request))
            enqueued = self._enqueued_at(request)
            if self._has_waiting_bound(request):
                ages = [(WAITING_BOUND, (enqueued,))]
            else:
                turn_bound, aging = self._turn_bounds
                ages = [(TURN_BOUND, (self._place_of(request), enqueued))] if turn_bound else []
                if aging:
                    ages.append((AGING, (self._aging_from(request), enqueued)))
        families = []
        for bound, age_key in ages:
            family = (bound, priority)
            aging = self._aging.get(family)
            if aging is None:
                aging = self._aging[family] = RunHeap()
            aging.push((*age_key, token, request))
            self._family_live[family] = self._family_live.get(family, 0) + 1
            families.append(family)
        self._members[id(request)] = (token, request, tuple(families))
        self._heap.push((*key, token, request))

    def _forget(self, request: R) -> None:
        self._peeked = None
        families = self._members.pop(id(request))[2]
        self._stale += 1 + len(families)  # its entries, lane and bounds
        for family in families:
            left = self._family_live[family] - 1
            if left:
                self._family_live[family] = left
                continue
            del self._family_live[family]  # nobody waits in it: its heap holds only stale entries
            self._stale -= len(self._aging.pop(family))
            self._on_empty(*family)

    def _live_entry(self, entry: tuple) -> bool:
        """Whether a heap entry (..., token, request) is still queued."""
        member = self._members.get(id(entry[-1]))
        return member is not None and member[0] == entry[-2]

    def _head(self) -> R:
        """The heap's first, unless a request whose bound passed goes first:
        the oldest overdue one with the waiting bound goes before everyone but
        preempted requests, but an overdue turn of an earlier program; the
        first overdue one with the turn bound before every request of a later
        program (a request without a session's program is itself); the oldest
        aged turn before later requests without a session."""
        first = self._live_first(self._heap)
        if first is None:
            raise IndexError("peek from an empty queue")
        priority, lane, top = first[0], first[1], first[-1]
        if lane == PREEMPTED or self._none_due(None, priority):
            return top  # (nobody overdue or aged: the heap's order)
        overdue = self._overdue_first((WAITING_BOUND, priority))
        head = overdue or top
        turn = self._overdue_first((TURN_BOUND, priority))
        if turn is not None and self._place_of(head) > self._place_of(turn):
            return turn  # before any request of a later program
        if overdue is None and not self._none_due(AGING, priority) and self._has_waiting_bound(head):
            aged = self._first_aged((AGING, priority))
            if (aged is not None and self._aging_from(aged) < self._enqueued_at(head)
                    and self._aged_out(aged)):
                return aged  # before later requests without a session
        return head

    def _first_aged(self, family: tuple[int, int]) -> R | None:
        aging = self._aging.get(family)
        first = self._live_first(aging) if aging is not None else None
        return first[-1] if first is not None else None

    def _live_first(self, heap: RunHeap) -> tuple | None:
        """The first entry of `heap` whose request is still queued there (the
        stale ones before it are dropped)."""
        member, first = self._members.get, heap.first()
        while first is not None and member(id(first[-1]), _GONE)[0] != first[-2]:  # not `_live_entry`: inlined
            heap.pop()
            self._stale -= 1
            first = heap.first()
        return first

    def _overdue_first(self, family: tuple[int, int]) -> R | None:
        """The first request of this bound and priority level, if it is overdue."""
        if self._none_due(*family):
            return None
        first = self._first_aged(family)
        return first if first is not None and self._overdue(first) else None

    def _compact(self) -> None:
        """Drop stale entries once they outnumber the live ones."""
        if self._stale > len(self._members) + 64:
            self._stale = 0
            self._heap.keep(self._live_entry)
            for aging in self._aging.values():
                aging.keep(self._live_entry)
