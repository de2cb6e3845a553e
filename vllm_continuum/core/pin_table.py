"""Which pins exist, whose prefix each one holds, until when, and how many
distinct blocks they hold together.

A pin is the set of block references a finished tool-call turn keeps alive
so that the session's next turn finds its prefix cached. A pin belongs to
its session *and its prefix*: session ids come from clients, so a request
only counts as the session's next turn if its prompt continues the pinned
context (its block hashes reach the pin's anchor, see `Anchor`). Parallel
branches of one session (forks, n > 1) keep separate pins; a newer pin
replaces an older one only if it holds all of the older one's blocks.

Pins of one deployment share blocks (the system prompt, a forked history):
caps and gauges count distinct blocks, each once, however many pins hold
it. The blocks themselves are opaque here; the adapter owns them and gives
each pin their ids.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum


class ReleaseReason(str, Enum):
    RESUMED = "resumed"  # handed to the session's next turn
    EXPIRED = "expired"  # TTL passed with no next turn
    PRESSURE = "pressure"  # blocks were needed by other work (or the cap)
    LAST_TURN = "last_turn"  # the session said it is done
    ABORTED = "aborted"  # a request of the session was aborted
    RESET = "reset"  # reset_prefix_cache, or shutdown
    REPLACED = "replaced"  # a newer pin of the same context holds all its blocks


@dataclass(frozen=True)
class Anchor:
    """The prefix a turn must continue to be its context's next turn: its
    first `num_blocks` block hashes. Hashes chain from the first block, so
    equality of the last one implies equality of all before it: O(1)."""

    num_blocks: int
    last_hash: Hashable

    def continued_by(self, hashes: Sequence[Hashable]) -> bool:
        n = self.num_blocks
        return n > 0 and len(hashes) >= n and hashes[n - 1] == self.last_hash

    @classmethod
    def of(cls, hashes: Sequence[Hashable], num_blocks: int) -> Anchor | None:
        n = min(num_blocks, len(hashes))
        return cls(n, hashes[n - 1]) if n > 0 else None

    @classmethod
    def of_prompt(cls, hashes: Sequence[Hashable], prompt_blocks: int) -> Anchor | None:
        """The anchor a turn whose prompt fills `prompt_blocks` full blocks leaves
        for its next turn: all of them but the last, which the next turn's
        tokenizer may re-cut where the new text joins (a BPE merge across the
        junction); a one-block prompt anchors on its only block."""
        return cls.of(hashes, prompt_blocks - 1 if prompt_blocks > 1 else prompt_blocks)


@dataclass(eq=False)
class Pin:
    session_id: str
    request_id: str
    tool: str
    blocks: Sequence[object]  # opaque to this module: the adapter's references
    block_ids: tuple[int, ...]  # distinct physical blocks, for accounting
    created_at: float
    expires_at: float
    # First arrival of the session: pins of later programs are released first.
    session_arrival: float
    anchor: Anchor | None = None
    hashes: tuple[Hashable, ...] = ()  # the held blocks' hashes, in order
    # Opaque token for the adapter (e.g. the step after which freeing is safe).
    fence: int = 0
    seq: int = field(default=0, compare=False)
    # Scheduling step in which the expired pin was kept for a turn being admitted.
    grace_step: int | None = None
    # From then on it gives way to waiting requests that need its blocks
    # (`pin_cost: pressure`: where Eq. 2 at full cost would have ended it).
    contested_at: float = float("inf")

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)

    @property
    def ttl_s(self) -> float:
        return self.expires_at - self.created_at

    def subsumed_by(self, hashes: Sequence[Hashable]) -> bool:
        """True if a context with these block hashes holds every block of this pin."""
        n = len(self.hashes)
        return n > 0 and len(hashes) >= n and hashes[n - 1] == self.hashes[-1]


class PinTable:
    def __init__(self) -> None:
        self._pins: dict[str, Pin] = {}  # request id -> pin
        self._by_session: dict[str, dict[str, Pin]] = {}  # oldest pin first
        self._refs: Counter[int] = Counter()  # block id -> pins holding it
        # (expires_at, seq, request id): a lazy heap, so that the per-step
        # expiry check is O(1) when nothing is due. Stale entries are skipped.
        self._deadlines: list[tuple[float, int, str]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._pins)

    def __bool__(self) -> bool:
        return bool(self._pins)

    def __iter__(self) -> Iterator[Pin]:
        return iter(list(self._pins.values()))

    @property
    def num_pinned_blocks(self) -> int:
        """Distinct blocks held by pins (a block shared by several counts once)."""
        return len(self._refs)

    def refs(self, block_id: int) -> int:
        return self._refs.get(block_id, 0)

    def marginal(self, block_ids: Iterable[int]) -> int:
        """Blocks of `block_ids` that no pin holds yet: what pinning them adds."""
        return sum(1 for b in set(block_ids) if b not in self._refs)

    def share(self, pin: Pin) -> float:
        """The pin's share of the pinned blocks (1/k of a block k pins hold):
        the shares of all pins add up to `num_pinned_blocks`."""
        return sum(1.0 / self._refs[b] for b in pin.block_ids)

    def count_with(self, add: Iterable[int], without: Sequence[Pin] = ()) -> int:
        """Distinct pinned blocks if the pins `without` went and a pin of `add` came."""
        going = Counter(b for p in without for b in set(p.block_ids))
        staying = {b for b, n in self._refs.items() if n > going.get(b, 0)}
        return len(staying | set(add))

    # --- membership ---------------------------------------------------------
    def get(self, session_id: str | None) -> Pin | None:
        """The session's newest pin, if any."""
        pins = self._by_session.get(session_id) if session_id is not None else None
        return next(reversed(pins.values())) if pins else None

    def of_session(self, session_id: str | None) -> list[Pin]:
        pins = self._by_session.get(session_id) if session_id is not None else None
        return list(pins.values()) if pins else []

    def holds(self, pin: Pin) -> bool:
        return self._pins.get(pin.request_id) is pin

    def add(self, pin: Pin) -> None:
        assert pin.request_id not in self._pins, "one pin per finished request"
        pin.seq = next(self._seq)
        self._pins[pin.request_id] = pin
        self._by_session.setdefault(pin.session_id, {})[pin.request_id] = pin
        self._refs.update(set(pin.block_ids))
        heapq.heappush(self._deadlines, (pin.expires_at, pin.seq, pin.request_id))

    def remove(self, pin: Pin) -> bool:
        """Forget `pin`; False if it was not (or no longer) in the table."""
        if not self.holds(pin):
            return False
        del self._pins[pin.request_id]
        session = self._by_session[pin.session_id]
        del session[pin.request_id]
        if not session:
            del self._by_session[pin.session_id]
        for b in set(pin.block_ids):
            self._refs[b] -= 1
            if self._refs[b] <= 0:
                del self._refs[b]
        return True

    # --- which pin a request of the session continues --------------------------
    def continued_by(self, session_id: str | None, hashes: Sequence[Hashable]) -> Pin | None:
        """The pin of `session_id` whose context a prompt with these block
        hashes continues: the longest anchor reached, then the newest pin."""
        best = None
        for pin in self.of_session(session_id):  # oldest first: ties go to the newest
            if pin.anchor is not None and pin.anchor.continued_by(hashes):
                if best is None or pin.anchor.num_blocks >= best.anchor.num_blocks:
                    best = pin
        return best

    def all_continued_by(self, session_id: str | None, hashes: Sequence[Hashable]) -> list[Pin]:
        """Every pin of `session_id` whose context these block hashes continue."""
        return [p for p in self.of_session(session_id)
                if p.anchor is not None and p.anchor.continued_by(hashes)]

    def subsumed_by(self, session_id: str, hashes: Sequence[Hashable]) -> list[Pin]:
        """Pins of the session whose every block a context with these hashes holds."""
        return [p for p in self.of_session(session_id) if p.subsumed_by(hashes)]

    # --- time -----------------------------------------------------------------
    def expired(self, now: float) -> list[Pin]:
        """Pins whose TTL has passed, soonest first (they stay in the table)."""
        due: list[Pin] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, seq, request_id = heapq.heappop(heap)
            pin = self._pins.get(request_id)
            if pin is not None and pin.seq == seq:
                due.append(pin)
        if len(heap) > 4 * len(self._pins) + 64:  # bound stale entries
            heap[:] = [e for e in heap if (p := self._pins.get(e[2])) and p.seq == e[1]]
            heapq.heapify(heap)
        return due

    def requeue(self, pin: Pin) -> None:
        """Report an expired pin again at the next check (its grace step)."""
        if self.holds(pin):
            heapq.heappush(self._deadlines, (pin.expires_at, pin.seq, pin.request_id))

    def release_order(self) -> list[Pin]:
        """Pins in the order pressure releases them: latest-arriving program
        first, and within a program its newest pin first."""
        return sorted(self._pins.values(), key=lambda p: (p.session_arrival, p.seq), reverse=True)
