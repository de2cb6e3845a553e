"""`RunHeap`: a priority queue like heapq, O(1) for entries that come in order."""

from __future__ import annotations

import functools

from hypothesis import given
from hypothesis import strategies as st

from vllm_continuum.core.run_heap import RunHeap

# An operation: push a key, or pop (None).
ops = st.lists(st.one_of(st.none(), st.integers(-50, 50)), max_size=200)


@given(ops, st.lists(st.integers(-50, 50), max_size=30))
def test_it_pops_what_a_sorted_list_would(operations, initial):
    heap, reference, token = RunHeap((k, i) for i, k in enumerate(initial)), [], len(initial)
    reference = sorted((k, i) for i, k in enumerate(initial))
    for op in operations:
        if op is None:
            if reference:
                assert heap.first() == reference[0]
                assert heap.pop() == reference.pop(0)
            else:
                assert heap.first() is None
        else:
            heap.push((op, token))  # entries are distinct: a token ends each
            token += 1
            reference.append((op, token - 1))
            reference.sort()
        assert len(heap) == len(reference) and bool(heap) == bool(reference)
        assert sorted(heap) == reference == list(heap.in_order())
    copy = heap.copy()
    drained = [heap.pop() for _ in range(len(heap))]
    assert drained == reference and len(copy) == len(reference)  # the copy is its own


@functools.total_ordering
class Counted:
    """A key that counts the comparisons made of it."""

    made = 0

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other) -> bool:
        Counted.made += 1
        return self.value == other.value

    def __lt__(self, other) -> bool:
        Counted.made += 1
        return self.value < other.value


def comparisons(keys: list[int]) -> int:
    """Comparisons made to push the keys, then pop them all, at every pop reading the first."""
    Counted.made = 0
    heap = RunHeap()
    for k in keys:
        heap.push(Counted(k))
    while heap:
        heap.first()
        heap.pop()
    return Counted.made


def test_entries_in_order_cost_a_few_comparisons_each_whatever_their_number():
    for n in (1_000, 10_000):
        assert comparisons(list(range(n))) <= 2 * n
    # Out of order, a heap's: O(log n) each.
    n = 10_000
    shuffled = [(i * 7919) % n for i in range(n)]
    assert comparisons(shuffled) > 10 * n


def test_entries_before_the_first_are_prepended_in_o1():
    """A preempted request put back at the front comes before every queued one."""
    assert comparisons(list(range(10_000, 0, -1))) <= 4 * 10_000


def test_reading_the_first_entries_in_order_costs_only_them():
    """`in_order` is lazy: the first k of n entries cost O(k log k) comparisons."""
    n = 10_000
    heap = RunHeap()
    for i in range(0, n, 2):
        heap.push(Counted(i))  # in order: the run
    for i in range(n // 2):
        heap.push(Counted(2 * ((i * 7919) % (n // 2)) + 1))  # odd ones, shuffled: the heap
    assert len(heap._run) > n // 3 and len(heap._heap) > n // 3
    Counted.made = 0
    first = [c.value for _, c in zip(range(10), heap.in_order())]
    assert first == list(range(10)) and Counted.made < 300
    assert len(heap) == n  # nothing taken


def test_a_mostly_ordered_stream_keeps_only_the_stragglers_in_the_heap():
    heap = RunHeap()
    for i in range(1_000):
        heap.push((i, i))
        if i % 100 == 99:
            heap.push((i - 50, -i))  # a straggler: belongs among earlier entries
    assert len(heap._heap) == 10 and len(heap) == 1_010
    assert [heap.pop()[0] for _ in range(len(heap))] == sorted(
        [i for i in range(1_000)] + [i - 50 for i in range(99, 1_000, 100)])


@given(st.lists(st.integers(-50, 50), max_size=200))
def test_keep_drops_what_is_gone_and_the_rest_pops_in_order(keys):
    heap = RunHeap()
    for token, k in enumerate(keys):
        heap.push((k, token))
    heap.keep(lambda e: e[1] % 3 != 0)
    kept = sorted((k, t) for t, k in enumerate(keys) if t % 3 != 0)
    assert list(heap.in_order()) == kept
    assert [heap.pop() for _ in range(len(heap))] == kept
