"""When pins go: the one place a pin leaves the table.

- `release`: for one of `ReleaseReason` (its next turn was admitted, its
  session ended or aborted, the cap or a newer pin of the same context took
  its place, a reset): its blocks go back to the pool, the release is
  counted, and its session's waiting turns change lane.
- `release_expired`: its TTL passed. The TTL is a hard bound, but for one
  scheduling step of grace when the pinned context's next turn is already
  queued (it is being admitted). A revisable pin (TTLDecision.revisable) is
  first offered to `revisit`, which may give it a new TTL (up to the cap
  when its next turn is queued).
- `retry_with_pins_released`: an allocation failed for lack of blocks. The
  fewest pins that cover the shortfall go, in release order (latest-arriving
  program first), if the pressure policy allows (`pressure.py`); else only
  pins that gave up their claim (past their contested TTL, for a request
  entitled to pinned memory; or of a program that lost its precedence). The
  allocation is retried once; if it fails anyway, nothing was released.
  A turn whose turn bound passed also takes pins of programs that arrived
  after its own; a turn that such pins hold back starts its turn bound.
  With a host tier that serves its tenant's lost pins back, a reloadable
  pin gives way to any waiting request, as under yield (reloadable.py).

Each operation reads pins in one of the table's orders, lazily, only as far
as it needs: its cost does not grow with the pins it does not touch.

Every time read here is the controller's step clock (`now`): nothing may
change what pins do between vLLM's peek at the queue and its pop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from itertools import chain, takewhile
from typing import Protocol, TypeVar

from vllm_continuum.core.ledger import BlockLedger
from vllm_continuum.core.pin_table import Pin, PinTable, ReleaseReason
from vllm_continuum.core.pressure import PressureRule, pins_to_release
from vllm_continuum.core.queue_rules import QueueRules
from vllm_continuum.core.turn import TurnRequest

logger = logging.getLogger("vllm.continuum")

T = TypeVar("T")


class ReleaseEvents(Protocol):
    def on_release(self, pin: Pin, reason: ReleaseReason, now: float) -> None: ...


class PinReleaser:
    def __init__(
        self,
        pins: PinTable,
        ledger: BlockLedger,
        stats: ReleaseEvents,
        queue: QueueRules,
        *,
        pressure: PressureRule,
        now: Callable[[], float],
        step: Callable[[], int],
        on_gone: Callable[[Pin], None],
        revisit: Callable[[Pin, float], float] | None = None,
    ) -> None:
        """`queue`: who is overdue or entitled, and the order and bounds it
        reads; `now`: the controller's clock; `step`: the scheduling steps so far (an expired pin's grace is
        one of them); `on_gone(pin)`: a pin left the table (its waiting turns
        change lane)."""
        self.pins, self.ledger, self.stats, self.queue = pins, ledger, stats, queue
        self.pressure = pressure
        self.now, self._step, self._on_gone = now, step, on_gone
        # `revisit(pin, now)`: how much longer a revisable pin past its TTL is held (0: not).
        self._revisit = revisit

    def release(self, pin: Pin, reason: ReleaseReason) -> None:
        if not self.pins.remove(pin):
            return
        self.ledger.give_back(pin.blocks, pin.fence)
        self.stats.on_release(pin, reason, self.now())
        self._on_gone(pin)

    def release_all(self, reason: ReleaseReason) -> None:
        for pin in self.pins:
            self.release(pin, reason)

    def release_continued(self, session: str, hashes: Sequence[Hashable], reason: ReleaseReason) -> None:
        """The session's pin whose context `hashes` continue, if any."""
        pin = self.pins.pin_continued_by(session, hashes)
        if pin is not None:
            self.release(pin, reason)

    def release_expired(self, grace_until: int) -> None:
        """Pins past their TTL; one whose next turn is queued stays until step `grace_until`."""
        if not self.pins:
            return
        now = self.now()
        for pin in self.pins.expired(now):
            if pin.revisable and self._revisit is not None:
                more = self._revisit(pin, now)
                if more > 0:
                    pin.expires_at = now + more
                    self.pins.requeue(pin)
                    continue
            if pin.grace_step is None and pin.waiters:
                pin.grace_step = grace_until
            if pin.grace_step is not None and self._step() <= pin.grace_step:
                self.pins.requeue(pin)
            else:
                self.release(pin, ReleaseReason.EXPIRED)

    @staticmethod
    def kept_past_ttl(pin: Pin) -> bool:
        """Whether the pin is past its TTL, kept for its queued turn."""
        return pin.grace_step is not None

    def retry_with_pins_released(
        self,
        request: TurnRequest,
        retry: Callable[[], T | None],
        *,
        shortfall: int | None,
        keep: frozenset[int],
        running: bool,
        preempted: bool,
        waiting: bool,
        anything_running: bool,
    ) -> T | None:
        """After an allocation for `request` failed: release the fewest pins
        that cover its `shortfall` of blocks (None: unknown) and `retry` once,
        if the pressure policy allows. If no set of pins covers it, or the
        retry fails anyway, nothing is released. Reads pins in release order
        only until they cover the shortfall."""
        refs = self.ledger.ref_count
        covered = shortfall is None or shortfall <= self.pins.num_pinned_blocks
        victims = covered and pins_to_release(self._releasable(self.pins.release_order()), shortfall,
                                              refs, keep=keep)
        if not victims:  # even every pin together would not cover it
            self._kept_out_by_later_pins(request, waiting, keep)
            return None
        queue = self.queue
        overdue = waiting and queue.has_waiting_bound(request) and queue.overdue(request)
        if not self.pressure.may_release_pins(running, anything_running=anything_running,
                                              preempted=preempted, overdue=overdue):
            victims = pins_to_release(self._takeable(request, waiting), shortfall, refs, keep=keep)
            if not victims:
                self._held(request, waiting, keep)
                return None
        return self._release_and_retry(request, victims, retry)

    def _releasable(self, pins: Iterable[Pin]) -> Iterator[Pin]:
        return (p for p in pins if self.ledger.can_give_back_now(p.fence))

    def _takeable(self, request: TurnRequest, waiting: bool) -> Iterator[Pin]:
        """Under hold, the pins that give way to `request` anyway, lazily: pins
        of later programs once its turn bound passed, pins of programs that
        lost their precedence, (for a request entitled to pinned memory) pins
        past their contested TTL, and reloadable pins (reloadable.py)."""
        queue, now = self.queue, self.now()
        later = iter(())
        if waiting and queue.turn_overdue(request):
            later = takewhile(queue.later_program(request), self.pins.release_order())
        lost = takewhile(lambda p: queue.order.lost_precedence(p.program_arrival, now),
                         self.pins.oldest_programs_first())
        contested = iter(())
        if queue.entitled(request):
            contested = takewhile(lambda p: p.contested_at <= now, self.pins.by_contested_ttl())
        seen: set[int] = set()
        reloadable = self.pins.reloadable_release_order()  # (none without a host tier)
        for pin in self._releasable(chain(later, lost, contested, reloadable)):
            if id(pin) not in seen:
                seen.add(id(pin))
                yield pin

    def _held(self, request: TurnRequest, waiting: bool, keep) -> None:
        """Pins could make room but are kept. A turn held by pins of later
        programs starts its turn bound; an aged turn held by earlier programs'
        pins waits for them as it would anyway (its aging restarts, and the
        requests behind it are not counted as held). Otherwise everyone
        waiting waits for pins (the waiting bound)."""
        queue = self.queue
        if not self._kept_out_by_later_pins(request, waiting, keep) and waiting and queue.aged(request):
            queue.waits_for_earlier_programs(request)
            return
        queue.bound.held_by_pins(queue.level(request), self.now())

    def _kept_out_by_later_pins(self, request: TurnRequest, waiting: bool, keep) -> bool:
        """A waiting turn needs memory that pins of later programs hold (some
        of it: running requests may hold the rest): its turn bound starts.
        Reads later programs' pins only until one would free a block."""
        queue = self.queue
        if not waiting or queue.has_waiting_bound(request) or not self.pins:
            return False
        later = takewhile(queue.later_program(request), self.pins.release_order())
        if not pins_to_release(self._releasable(later), 1, self.ledger.ref_count, keep=keep):
            return False
        queue.held_by_later_pins(request)
        return True

    def _release_and_retry(self, request: TurnRequest, victims: list[Pin], retry: Callable[[], T | None]) -> T | None:
        for pin in victims:
            self.pins.remove(pin)
            self.ledger.give_back(pin.blocks, pin.fence)
        allocated = retry()
        if allocated is None:  # the estimate was wrong: restore, nothing was taken
            logger.debug("continuum: %d pins did not cover the shortfall of %s; kept",
                         len(victims), request.request_id)
            for pin in victims:
                self.ledger.take_back(pin.blocks)
                self.pins.add(pin)
            return None
        now = self.now()
        for pin in victims:
            self.stats.on_release(pin, ReleaseReason.PRESSURE, now)
            self._on_gone(pin)
        return allocated
