"""The waiting bound: how long our queue order and our pins may make a
request wait beyond what stock vLLM would.

A request's *extra wait* begins the first time either happens to it:

- it is passed: a request that arrived after it (same priority level) is
  admitted first. Stock vLLM's FCFS never does that, so from then on the
  wait is ours. Requests that arrived earlier, or of better priority, going
  first is stock behaviour and starts nothing.
- it is held back by pins: the head of the queue could not be admitted,
  pins could have made room, and the pressure policy (hold) kept them.
  vLLM stops at the first request that does not fit, so every request
  waiting then is held back with it: their extra wait begins too.

Once its extra wait has lasted `max_delay_s`, the request is *overdue*: the
queue puts it first (no later arrival passes it again) and pins give way to
it under either pressure policy. A request that only waits because the
server is saturated (everyone ahead of it arrived earlier) is never
overdue: under load that is the same wait as on stock vLLM, and it must not
switch the agents' ordering off for everyone.

"First passed" is kept without touching every waiting request at each
admission: admissions (and holds) only raise, per priority level, the latest
enqueue time gone ahead so far (a monotone staircase of (time, enqueue time)
marks), and a request was first passed at the first mark whose enqueue time
is later than its own (a binary search). So the oldest waiting request is
always the first to be overdue: the queue need only check it.

The turn bound (`max_turn_delay_s`) is the same structure keyed by program
arrival instead of enqueue time: a session's turn is passed when pins of
later programs hold memory it needs, or a later program's turn is admitted
from the regular lane (queue_rules.py), and the earliest program's turn is
the first to be overdue. A turn's aging is the same structure again, keyed
by where its aging counts from, and fed only by admissions of requests
without a session.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable


class WaitingBound:
    def __init__(self, max_delay_s: float) -> None:
        self.max_delay_s = max_delay_s
        # Per priority level: mark times, and the latest enqueue time admitted by
        # then. A level has marks only while requests of it wait (`forget_level`),
        # so clients choosing many priorities cost memory only while they wait.
        self._times: dict[int, list[float]] = {}
        self._latest: dict[int, list[float]] = {}
        self._touched: set[int] = set()  # levels marked since the last prune

    @property
    def off(self) -> bool:
        """An infinite bound: nobody is ever overdue (its marks are still kept)."""
        return self.max_delay_s == math.inf

    def went_ahead(self, enqueued_at: float, level: int, now: float) -> None:
        """A request enqueued at `enqueued_at` was admitted (or held at the
        head): every waiting request of its level that arrived earlier is passed."""
        latest = self._latest.get(level)
        if latest is None:  # (no list built per admission, as setdefault would)
            latest = self._latest[level] = []
            self._times[level] = []
        if not latest or enqueued_at > latest[-1]:
            latest.append(enqueued_at)
            self._times[level].append(now)
            self._touched.add(level)

    def held_by_pins(self, level: int, now: float) -> None:
        """Pins kept memory the head of the queue needed: everyone waiting now
        (enqueued before now, on the same clock) waits for them."""
        self.went_ahead(now, level, now)

    def extra_since(self, enqueued_at: float, level: int) -> float | None:
        """When the extra wait of a request enqueued then began (None: none yet)."""
        latest = self._latest.get(level)
        if latest:
            i = bisect.bisect_right(latest, enqueued_at)
            if i < len(latest):
                return self._times[level][i]
        return None

    def overdue(self, enqueued_at: float, level: int, now: float) -> bool:
        since = self.extra_since(enqueued_at, level)
        return since is not None and now - since >= self.max_delay_s

    def anyone_overdue(self, level: int, now: float) -> bool:
        """False if no request of the level can be overdue now: the earliest
        mark (marks are kept in time order) is not `max_delay_s` old. O(1);
        `overdue` is False for every request whenever this is."""
        times = self._times.get(level)
        return bool(times) and now - times[0] >= self.max_delay_s

    def prune(self, first_of: Callable[[int], float | None]) -> None:
        """Drop the marks no waiting request can be passed by, at the levels
        marked since the last prune (the others did not change): `first_of(level)`,
        where the first request waiting at that level stands (every other
        arrived at or after it; None: nobody waits at that level). O(levels
        marked) amortized, however many levels exist."""
        for level in self._touched:
            latest = self._latest.get(level)
            if latest is None:
                continue
            first = first_of(level)
            if first is None:
                self.forget_level(level)
                continue
            i = bisect.bisect_right(latest, first)
            del latest[:i]
            del self._times[level][:i]
            if not latest:
                self.forget_level(level)
        self._touched.clear()

    def forget_level(self, level: int) -> None:
        """Nobody waits at this level any more: its marks go."""
        self._latest.pop(level, None)
        self._times.pop(level, None)

    def clear(self) -> None:
        """Nobody waits at all: every mark goes."""
        self._latest.clear()
        self._times.clear()
        self._touched.clear()

    @property
    def num_levels(self) -> int:
        """Levels with marks (each has requests waiting, or had at its last prune)."""
        return len(self._latest)


def anyone_overdue(bounds: Iterable[WaitingBound], level: int, now: float) -> bool:
    """`WaitingBound.anyone_overdue` of any of `bounds`, in one call (the
    queue asks at every peek)."""
    for bound in bounds:  # (not any() over a generator: this runs at every peek)
        if bound.anyone_overdue(level, now):
            return True
    return False
