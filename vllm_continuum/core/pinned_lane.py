"""Which queued turns continue which pin: the pinned lane's bookkeeping.

A session's requests wait in arrival order until admitted or finished. A
queued turn whose prompt continues a pin's context joins that pin's
waiters (the pinned lane, queue_rules.py) when it arrives, or, if the pin
is made after it arrived (a connector freed the blocks late), when the pin
is made. When the pin goes, its waiters leave the lane; each change of
lane is reported (`on_lane_change`), so the waiting queue moves the request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from vllm_continuum.core.indexes import discard
from vllm_continuum.core.pin_table import Pin
from vllm_continuum.core.turn import Turn, TurnRequest


class PinnedLane:
    def __init__(self, turns: dict[str, Turn], on_lane_change: Callable[[TurnRequest], None]) -> None:
        """`turns`: the controller's, by request id (read, never changed here)."""
        self.turns = turns
        self._on_lane_change = on_lane_change
        # Requests of each session not admitted yet, in arrival order.
        self._queued: dict[str, dict[str, TurnRequest]] = {}

    def queued(self, request: TurnRequest, turn: Turn, pin: Pin | None) -> None:
        """A request of `turn.session` arrived; `pin`: the pin its prompt continues."""
        self._queued.setdefault(turn.session, {})[request.request_id] = request
        if pin is not None:
            self._attach(request, turn, pin)

    def dequeued(self, request: TurnRequest, turn: Turn) -> None:
        """Admitted or finished: no longer a queued turn."""
        if turn.pin is not None:
            turn.pin.waiters.pop(request.request_id, None)
            turn.pin = None
        if turn.session is not None:
            discard(self._queued, turn.session, request.request_id)

    def pin_made(self, pin: Pin, ended_seq: int) -> None:
        """A new pin: queued turns of its session that arrived after its turn
        ended (arrival number `ended_seq`) and continue it join the lane.
        Turns that arrived before cannot be its next turn: they are not read,
        so a session's flood of queued requests costs nothing."""
        queued = self._queued.get(pin.session_id)
        if not queued:
            return
        for request_id in reversed(list(self._tail_after(queued, ended_seq))):
            request, turn = queued[request_id], self.turns[request_id]
            if turn.pin is None and pin.anchor.continued_by(request.block_hashes):
                self._attach(request, turn, pin)
                self._on_lane_change(request)

    def pin_gone(self, pin: Pin) -> None:
        """A pin left the table: its queued turns leave the lane."""
        for request_id, request in pin.waiters.items():
            turn = self.turns.get(request_id)
            if turn is not None and turn.pin is pin:
                turn.pin = None
                self._on_lane_change(request)
        pin.waiters.clear()

    @staticmethod
    def _attach(request: TurnRequest, turn: Turn, pin: Pin) -> None:
        turn.pin = pin
        pin.waiters[request.request_id] = request

    def _tail_after(self, queued: dict[str, TurnRequest], seq: int) -> Iterator[str]:
        """Ids of the queued requests that arrived after arrival number `seq`,
        newest first: O(those)."""
        for request_id in reversed(queued):
            turn = self.turns.get(request_id)
            if turn is None or turn.seq <= seq:
                return
            yield request_id
