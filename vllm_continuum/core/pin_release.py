"""When pins go: the one place a pin leaves the table.

- `release`: for one of `ReleaseReason` (its next turn was admitted, its
  session ended or aborted, the cap or a newer pin of the same context took
  its place, a reset): its blocks go back to the pool, the release is
  counted, and its session's waiting turns change lane.
- `release_expired`: its TTL passed. The TTL is a hard bound, but for one
  scheduling step of grace when the pinned context's next turn is already
  queued (it is being admitted).
- `retry_with_pins_released`: an allocation failed for lack of blocks. The
  fewest pins that cover the shortfall go, in release order (latest-arriving
  program first), if the pressure policy allows (`pressure.py`); else only
  pins that gave up their claim (past their contested TTL, for a request
  entitled to pinned memory; or of a program that lost its precedence). The
  allocation is retried once; if it fails anyway, nothing was released.

Every time read here is the controller's step clock (`now`): nothing may
change what pins do between vLLM's peek at the queue and its pop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Protocol, TypeVar

from vllm_continuum.core.ledger import BlockLedger
from vllm_continuum.core.pin_table import Pin, PinTable, ReleaseReason
from vllm_continuum.core.pressure import PressurePolicy, may_release_pins, pins_to_release
from vllm_continuum.core.queue_rules import QueueRules
from vllm_continuum.core.sessions import session_key
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
        pressure_policy: PressurePolicy,
        step: Callable[[], int],
        waiting_of: Callable[[str], Iterable[TurnRequest]],
        on_lane_change: Callable[[str], None],
    ) -> None:
        """`queue`: who is overdue or entitled, and the clock, order and bound
        it reads; `step`: the scheduling steps so far (an expired pin's grace is
        one of them); `waiting_of(session)`: queued requests that may be its."""
        self.pins, self.ledger, self.stats, self.queue = pins, ledger, stats, queue
        self.pressure_policy = pressure_policy
        self._step, self._waiting_of, self._on_lane_change = step, waiting_of, on_lane_change

    def release(self, pin: Pin, reason: ReleaseReason) -> None:
        if not self.pins.remove(pin):
            return
        self.ledger.give_back(pin.blocks, pin.fence)
        self.stats.on_release(pin, reason, self.queue.now())
        self._on_lane_change(pin.session_id)

    def release_all(self, reason: ReleaseReason) -> None:
        for pin in self.pins:
            self.release(pin, reason)

    def release_continued(self, session: str, hashes: Sequence[Hashable], reason: ReleaseReason) -> None:
        """The session's pin whose context `hashes` continue, if any."""
        pin = self.pins.continued_by(session, hashes)
        if pin is not None:
            self.release(pin, reason)

    def release_expired(self, grace_until: int) -> None:
        """Pins past their TTL; one whose next turn is queued stays until step `grace_until`."""
        if not self.pins:
            return
        for pin in self.pins.expired(self.queue.now()):
            if pin.grace_step is None and self._next_turn_waiting(pin):
                pin.grace_step = grace_until
            if pin.grace_step is not None and self._step() <= pin.grace_step:
                self.pins.requeue(pin)
            else:
                self.release(pin, ReleaseReason.EXPIRED)

    def held(self, session: str) -> bool:
        """Whether one of the session's pins is past its TTL, kept for its queued turn."""
        return any(p.grace_step is not None for p in self.pins.of_session(session))

    def _next_turn_waiting(self, pin: Pin) -> bool:
        return pin.anchor is not None and any(
            session_key(r.session_id) == pin.session_id and pin.anchor.continued_by(r.block_hashes)
            for r in self._waiting_of(pin.session_id)
        )

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
        retry fails anyway, nothing is released."""
        queue = self.queue
        candidates = [p for p in self.pins.release_order() if self.ledger.can_give_back_now(p.fence)]
        victims = pins_to_release(candidates, shortfall, self.ledger.ref_count, keep=keep)
        if not victims:
            return None
        if not may_release_pins(
            self.pressure_policy,
            running,
            anything_running=anything_running,
            preempted=preempted,
            overdue=waiting and queue.overdue(request),
        ):
            # Only pins past their contested TTL give way (to a request entitled
            # to pinned memory), and pins of a program that lost its precedence;
            # if they do not cover it, pins could make room but are kept:
            # everyone waiting waits.
            now = queue.now()
            entitled = queue.entitled(request)
            takeable = [p for p in candidates
                        if (entitled and p.contested_at <= now)
                        or queue.order.lost_precedence(p.session_arrival, now)]
            victims = pins_to_release(takeable, shortfall, self.ledger.ref_count, keep=keep)
            if not victims:
                queue.bound.held_by_pins(queue.level(request), now)
                return None
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
        now = queue.now()
        for pin in victims:
            self.stats.on_release(pin, ReleaseReason.PRESSURE, now)
            self._on_lane_change(pin.session_id)
        return allocated
