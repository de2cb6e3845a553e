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

import math
import itertools
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from vllm_continuum.core.lost_pin import NOTHING_HELD, Held
from vllm_continuum.core.run_heap import RunHeap


_NO_REFS: Counter = Counter()  # a session without pins (read only)


class ReleaseReason(str, Enum):
    RESUMED = "resumed"  # handed to the session's next turn
    EXPIRED = "expired"  # TTL passed with no next turn
    PRESSURE = "pressure"  # blocks were needed by other work (or the cap)
    LAST_TURN = "last_turn"  # the session said it is done
    ABORTED = "aborted"  # a request of the session was aborted
    RESET = "reset"  # reset_prefix_cache, or shutdown
    REPLACED = "replaced"  # a newer pin of the same context holds all its blocks


class Anchor(NamedTuple):
    """The prefix a turn must continue to be its context's next turn: its
    first `num_blocks` block hashes. Hashes chain from the first block, so
    equality of the last one implies equality of all before it: O(1). (A
    named tuple: one is built at every turn's end, cheaply.)"""

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


@dataclass(eq=False, slots=True)
class Pin:
    session_id: str
    request_id: str
    tool: str
    blocks: Sequence[object]  # opaque to this module: the adapter's references
    block_ids: tuple[int, ...]  # distinct physical blocks, for accounting
    created_at: float
    expires_at: float
    # Its program's first arrival: pins of later programs are released first.
    program_arrival: float
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
    # Its TTL policy decides again when it expires (TTLDecision.revisable), on
    # the tokens it holds.
    revisable: bool = False
    context_tokens: int = 0
    program: object = field(default=None, compare=False)  # the program whose context it holds (programs.py)
    # Of them, what a host tier held when the pin was made (lost_pin.py).
    held: Held = NOTHING_HELD
    # Losing it costs a reload, not a prefill: it may give way under hold (reloadable.py).
    reloadable: bool = False
    # Queued requests (by id) whose context it holds: the pinned lane's turns.
    waiters: dict[str, object] = field(default_factory=dict, compare=False)
    block_id_set: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.block_id_set = frozenset(self.block_ids)

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
    """Pins, indexed so that every operation costs O(log n) in the number of
    pins, or O(what it returns), whatever the traffic:

    - by request id, and per session;
    - per session by the last hash of each pin's anchor and of its blocks, so
      that finding the pins a prompt continues (or holds) looks up either the
      prompt's hashes or the session's pins, whichever are fewer;
    - distinct blocks with their reference counts, in all and per session;
    - by deadline (expiry), and in release order, of all pins and of the
      reloadable ones (heaps walked lazily: taking the first k pins in such
      an order costs O(k log k)).
    """

    def __init__(self) -> None:
        self._pins: dict[str, Pin] = {}  # request id -> pin
        self._by_session: dict[str, dict[str, Pin]] = {}  # oldest pin first
        # session -> anchor's last hash (resp. blocks' last hash) -> pins
        self._anchors: dict[str, dict[Hashable, list[Pin]]] = {}
        self._tails: dict[str, dict[Hashable, list[Pin]]] = {}
        self._refs: Counter[int] = Counter()  # block id -> pins holding it
        self._session_refs: dict[str, Counter[int]] = {}  # the same, per session
        # (expires_at, seq, request id): a lazy heap, so that the per-step
        # expiry check is O(1) when nothing is due. Stale entries are skipped.
        # RunHeaps: a pin of the newest program, or one of the usual TTL, is
        # pushed in O(1) (run_heap.py).
        self._deadlines = RunHeap()
        # (*order key, seq, request id), lazy heaps: release order (latest
        # program first), oldest program first, and by contested TTL. Entries
        # are flat tuples (compared several times faster than nested keys, in
        # the same order), seq and request id always last.
        self._release = RunHeap()
        self._oldest = RunHeap()
        self._contested = RunHeap()
        self._reloadable = RunHeap()  # release order, reloadable pins only
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
        """Distinct pinned blocks if the pins `without` went and a pin of `add`
        came. O(their blocks)."""
        return _count_with(self._refs, add, without)

    def session_count_with(self, session: str, add: Iterable[int], without: Sequence[Pin] = ()) -> int:
        """The same, for the pins of one session."""
        return _count_with(self._session_refs.get(session, _NO_REFS), add, without)

    def session_holds(self, session: str, block_id: int, without: Sequence[Pin] = ()) -> bool:
        """Whether a pin of `session` other than `without` holds the block."""
        held = self._session_refs.get(session, _NO_REFS).get(block_id, 0)
        return held > (sum(1 for p in without if block_id in p.block_id_set) if without else 0)

    # --- membership ---------------------------------------------------------
    def get(self, session_id: str | None) -> Pin | None:
        """The session's newest pin, if any."""
        pins = self._by_session.get(session_id) if session_id is not None else None
        return next(reversed(pins.values())) if pins else None

    def of_session(self, session_id: str | None) -> list[Pin]:
        pins = self._by_session.get(session_id) if session_id is not None else None
        return list(pins.values()) if pins else []

    def has_session(self, session_id: str | None) -> bool:
        return session_id in self._by_session

    def holds(self, pin: Pin) -> bool:
        return self._pins.get(pin.request_id) is pin

    def add(self, pin: Pin) -> None:
        assert pin.request_id not in self._pins, "one pin per finished request"
        pin.seq = next(self._seq)
        self._pins[pin.request_id] = pin
        session = pin.session_id
        _inner(self._by_session, session)[pin.request_id] = pin
        if pin.anchor is not None:
            _add_to_list(_inner(self._anchors, session), pin.anchor.last_hash, pin)
        if pin.hashes:
            _add_to_list(_inner(self._tails, session), pin.hashes[-1], pin)
        blocks = pin.block_id_set
        _increment(self._refs, blocks)
        _increment(_inner(self._session_refs, session, Counter), blocks)
        self._deadlines.push((pin.expires_at, pin.seq, pin.request_id))
        self._release.push((-pin.program_arrival, -pin.seq, pin.seq, pin.request_id))
        self._oldest.push((pin.program_arrival, pin.seq, pin.seq, pin.request_id))
        if pin.reloadable:
            self._reloadable.push((-pin.program_arrival, -pin.seq, pin.seq, pin.request_id))
        if pin.contested_at != math.inf:
            self._contested.push((pin.contested_at, pin.seq, pin.request_id))

    def remove(self, pin: Pin) -> bool:
        """Forget `pin`; False if it was not (or no longer) in the table."""
        if not self.holds(pin):
            return False
        del self._pins[pin.request_id]
        session = pin.session_id
        _discard(self._by_session, session, pin.request_id)
        if pin.anchor is not None:
            _discard_from_list(self._anchors, session, pin.anchor.last_hash, pin)
        if pin.hashes:
            _discard_from_list(self._tails, session, pin.hashes[-1], pin)
        session_refs = self._session_refs[session]
        for b in pin.block_id_set:
            _decrement(self._refs, b)
            _decrement(session_refs, b)
        if not session_refs:
            del self._session_refs[session]
        self._compact()
        return True

    # --- which pin a request of the session continues --------------------------
    def pin_continued_by(self, session_id: str | None, hashes: Sequence[Hashable]) -> Pin | None:
        """The pin of `session_id` whose context a prompt with these block
        hashes continues: the longest anchor reached, then the newest pin."""
        best = None
        for pin in self._candidates(self._anchors, session_id, hashes):  # unsorted: a max
            anchor = pin.anchor
            if anchor is not None and anchor.continued_by(hashes) and (
                    best is None or (anchor.num_blocks, pin.seq) > (best.anchor.num_blocks, best.seq)):
                best = pin
        return best

    def pins_continued_by(self, session_id: str | None, hashes: Sequence[Hashable]) -> list[Pin]:
        """Every pin of `session_id` whose context these block hashes continue.
        O(min(prompt blocks, the session's pins))."""
        return self._matching(self._anchors, session_id, hashes,
                              lambda p: p.anchor is not None and p.anchor.continued_by(hashes))

    def pins_subsumed_by(self, session_id: str, hashes: Sequence[Hashable]) -> list[Pin]:
        """Pins of the session whose every block a context with these hashes holds."""
        return self._matching(self._tails, session_id, hashes, lambda p: p.subsumed_by(hashes))

    def _matching(self, index, session_id, hashes, test) -> list[Pin]:
        found = [p for p in self._candidates(index, session_id, hashes) if test(p)]
        if len(found) > 1:  # (mostly none or one)
            found.sort(key=_seq)
        return found

    def _candidates(self, index, session_id, hashes) -> Iterable[Pin]:
        """The session's pins indexed under one of `hashes` in `index` (each once),
        or all its pins if they are fewer than the hashes."""
        by_hash = index.get(session_id) if session_id is not None else None
        if not by_hash:
            return ()
        if len(hashes) < len(self._by_session[session_id]):
            return [p for h in dict.fromkeys(hashes) for p in by_hash.get(h, ())]
        return self._by_session[session_id].values()

    # --- time -----------------------------------------------------------------
    def expired(self, now: float) -> list[Pin]:
        """Pins whose TTL has passed, soonest first (they stay in the table)."""
        due: list[Pin] = []
        heap = self._deadlines
        while (first := heap.first()) is not None and first[0] <= now:
            _, seq, request_id = heap.pop()
            pin = self._live(seq, request_id)
            if pin is not None:
                due.append(pin)
        return due

    def requeue(self, pin: Pin) -> None:
        """Report an expired pin again at the next check (its grace step)."""
        if self.holds(pin):
            self._deadlines.push((pin.expires_at, pin.seq, pin.request_id))

    def release_order(self) -> Iterator[Pin]:
        """Pins in the order pressure releases them: latest-arriving program
        first, and within a program its newest pin first. Lazy: the first k
        cost O(k log k), however many pins there are."""
        return self._walk(self._release)

    def oldest_programs_first(self) -> Iterator[Pin]:
        """Pins of the earliest-arriving program first (lazy, as release_order)."""
        return self._walk(self._oldest)

    def reloadable_release_order(self) -> Iterator[Pin]:
        """Reloadable pins only, in release order (lazy, as release_order)."""
        return self._walk(self._reloadable)

    def by_contested_ttl(self) -> Iterator[Pin]:
        """Pins that have a contested TTL, the earliest first (lazy)."""
        return self._walk(self._contested)

    def _walk(self, heap: RunHeap) -> Iterator[Pin]:
        """A heap's live pins in order, without popping it (lazily: a walk is
        read only while no pin is added or removed)."""
        for entry in heap.in_order():
            pin = self._live(entry[-2], entry[-1])
            if pin is not None:
                yield pin

    def _live(self, seq: int, request_id: str) -> Pin | None:
        pin = self._pins.get(request_id)
        return pin if pin is not None and pin.seq == seq else None

    def _compact(self) -> None:
        """Drop stale heap entries once they outnumber the live ones."""
        for heap in (self._deadlines, self._release, self._oldest, self._contested, self._reloadable):
            if len(heap) > 4 * len(self._pins) + 64:
                heap.keep(lambda e: self._live(e[-2], e[-1]) is not None)


def _seq(pin: Pin) -> int:
    return pin.seq


def _count_with(refs: Counter, add: Iterable[int], without: Sequence[Pin]) -> int:
    if not without:  # the common case: no Counter built
        return len(refs) + len({b for b in add if b not in refs})
    going = Counter(b for p in without for b in p.block_id_set)
    gone = {b for b, n in going.items() if n >= refs.get(b, 0)}
    new = {b for b in add if b not in refs or b in gone}
    return len(refs) - len(gone) + len(new)


def _inner(index: dict, key, new=dict):
    """`index[key]`, a `new()` one if missing (none built per call, as
    `setdefault(key, {})` would: a pin is made at every tool call)."""
    inner = index.get(key)
    if inner is None:
        inner = index[key] = new()
    return inner


def _add_to_list(index: dict, key, member) -> None:
    members = index.get(key)
    if members is None:
        index[key] = [member]
    else:
        members.append(member)


def _discard(index: dict, key, member) -> None:
    inner = index[key]
    del inner[member]
    if not inner:
        del index[key]


def _discard_from_list(index: dict, session, key, pin: Pin) -> None:
    by_hash = index[session]
    pins = by_hash[key]
    pins.remove(pin)
    if not pins:
        del by_hash[key]
        if not by_hash:
            del index[session]


def _increment(counter: Counter, keys: Iterable) -> None:
    """`counter.update(keys)` without Counter.update's per-call isinstance(Mapping)."""
    get = counter.get
    for key in keys:
        counter[key] = get(key, 0) + 1


def _decrement(counter: Counter, key) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
