"""Which sessions hold pinned KV blocks, until when, and in what release order.

A pin is the set of block references a finished tool-call turn keeps alive
so that the session's next turn finds its prefix cached. At most one pin per
session: a newer turn's prompt contains the older one's, so the newer pin
supersedes it. The blocks are opaque here; the scheduler adapter owns them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum


class ReleaseReason(str, Enum):
    RESUMED = "resumed"  # handed to the session's next turn
    EXPIRED = "expired"  # TTL passed with no next turn
    PRESSURE = "pressure"  # blocks were needed by other work (or the cap)
    LAST_TURN = "last_turn"  # the session said it is done
    ABORTED = "aborted"  # a request of the session was aborted
    RESET = "reset"  # reset_prefix_cache, or shutdown
    REPLACED = "replaced"  # a newer turn of the same session pinned


@dataclass
class Pin:
    session_id: str
    request_id: str
    tool: str
    blocks: Sequence[object]
    num_blocks: int
    created_at: float
    expires_at: float
    # First arrival of the session: pins of later programs are released first.
    session_arrival: float
    # Opaque token for the adapter (e.g. the step after which freeing is safe).
    fence: int = 0
    seq: int = field(default=0, compare=False)

    @property
    def ttl_s(self) -> float:
        return self.expires_at - self.created_at


class PinTable:
    def __init__(self) -> None:
        self._pins: dict[str, Pin] = {}
        self.num_pinned_blocks = 0
        # (expires_at, seq, session): a lazy heap, so that the per-step expiry
        # check is O(1) when nothing is due. Stale entries are skipped.
        self._deadlines: list[tuple[float, int, str]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._pins)

    def __iter__(self) -> Iterator[Pin]:
        return iter(list(self._pins.values()))

    def get(self, session_id: str | None) -> Pin | None:
        return self._pins.get(session_id) if session_id is not None else None

    def add(self, pin: Pin) -> Pin | None:
        """Store `pin`; return the pin it replaced, which the caller must release."""
        old = self.pop(pin.session_id)
        pin.seq = next(self._seq)
        self._pins[pin.session_id] = pin
        self.num_pinned_blocks += pin.num_blocks
        heapq.heappush(self._deadlines, (pin.expires_at, pin.seq, pin.session_id))
        return old

    def pop(self, session_id: str) -> Pin | None:
        pin = self._pins.pop(session_id, None)
        if pin is not None:
            self.num_pinned_blocks -= pin.num_blocks
        return pin

    def expired(self, now: float) -> list[Pin]:
        """Pins whose TTL has passed, soonest first (they stay in the table)."""
        due: list[Pin] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, seq, session_id = heapq.heappop(heap)
            pin = self._pins.get(session_id)
            if pin is not None and pin.seq == seq:
                due.append(pin)
        if len(heap) > 4 * len(self._pins) + 64:  # bound stale entries
            heap[:] = [e for e in heap if (p := self._pins.get(e[2])) and p.seq == e[1]]
            heapq.heapify(heap)
        return due

    def requeue(self, pin: Pin) -> None:
        """Keep an expired pin a while longer (its session has a turn waiting)."""
        if self._pins.get(pin.session_id) is pin:
            heapq.heappush(self._deadlines, (pin.expires_at, pin.seq, pin.session_id))

    def release_order(self) -> list[Pin]:
        """Pins in the order pressure releases them: latest-arriving program first."""
        return sorted(self._pins.values(), key=lambda p: p.session_arrival, reverse=True)
