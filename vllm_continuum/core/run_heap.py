"""A priority queue for entries that mostly come in order.

The queues of a scheduler are first come, first served at heart: a new
request's key is mostly no smaller than any queued before it (it arrived
last), and the first entry is the one taken. A binary heap pays O(log n)
comparisons of its (long, tuple) entries at every push and pop for that.
`RunHeap` keeps the entries that come in order in a run (a sorted deque:
an entry past its last is appended, one before its first, such as a
preempted request put back at the front, is prepended, both in O(1)) and
only the others in a heap; its first entry is the smaller of the two fronts.

Push: O(1) in order, else O(log h); pop: O(1) from the run, else O(log h);
h is the number of entries that came out of order. Entries must be totally
ordered and distinct (the queues end each with a unique token).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Iterator


class RunHeap:
    __slots__ = ("_run", "_heap")

    def __init__(self, entries: Iterable = ()) -> None:
        """The entries in any order (sorted once, into the run)."""
        self._run: deque = deque(sorted(entries))
        self._heap: list = []

    def push(self, entry) -> None:
        run = self._run
        if not run or entry > run[-1]:
            run.append(entry)
        elif entry < run[0]:
            run.appendleft(entry)
        else:
            heapq.heappush(self._heap, entry)

    def first(self):
        """The smallest entry (None if empty)."""
        run, heap = self._run, self._heap
        if heap and (not run or heap[0] < run[0]):
            return heap[0]
        return run[0] if run else None

    def pop(self):
        """Remove and return the smallest entry (IndexError if empty)."""
        run, heap = self._run, self._heap
        if heap and (not run or heap[0] < run[0]):
            return heapq.heappop(heap)
        return run.popleft()

    def in_order(self) -> Iterator:
        """Every entry, smallest first, without taking any: lazy, the first k
        cost O(k log k) however many there are (the heap is read as a tree,
        from a frontier of the nodes whose parents were read). The run and
        the heap must not change while it is read."""
        return heapq.merge(self._run, _walk(self._heap))

    def keep(self, live: Callable[[object], bool]) -> None:
        """Drop the entries `live` says are gone: O(n), the run stays sorted."""
        self._run = deque(e for e in self._run if live(e))
        self._heap = [e for e in self._heap if live(e)]
        heapq.heapify(self._heap)

    def copy(self) -> RunHeap:
        other = RunHeap()
        other._run, other._heap = deque(self._run), list(self._heap)
        return other

    def __len__(self) -> int:
        return len(self._run) + len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._run) or bool(self._heap)

    def __iter__(self) -> Iterator:
        """Every entry, in no particular order."""
        yield from self._run
        yield from self._heap


def _walk(heap: list) -> Iterator:
    """A heap's entries in order, without popping it."""
    frontier = [(heap[0], 0)] if heap else []
    while frontier:
        entry, i = heapq.heappop(frontier)
        for child in (2 * i + 1, 2 * i + 2):
            if child < len(heap):
                heapq.heappush(frontier, (heap[child], child))
        yield entry
