"""When an allocation that failed for lack of blocks may take them from pins,
and which pins then go.

Whatever the policy, pins give way before a running request would be
preempted (preemption throws away computed KV of a live request to keep KV
of an idle one), to a preempted request at the head of the queue (it has
already lost its KV once), and to a request that has waited
`max_queue_delay_s` (the waiting bound). The policies differ for the rest
of the waiting requests:

- hold (the paper's Algorithm 1, the default): pins under the cap are kept
  while other work runs, since running work will free blocks soon and the
  pinned session's return saves a full prefill. Only the deadlock guard
  releases them: nothing runs, and the head of the queue cannot be admitted.
  Under memory pressure this measured better than yield (docs/results/benchmarks-archive.md):
  yield gives the pins up nearly always, so they buy nothing.
- yield: always. Pins never delay admission; they only use memory nobody
  else wants.

Which pins go: `pins_to_release` walks them in release order (latest-arriving
program first, `PinTable.release_order`) and takes the fewest that free
the blocks needed, counting a block as freed only when every reference to it
goes: blocks shared with running requests, with pins that stay, or part of
the requester's own prefix hit free nothing. If even every candidate would
not free enough, it takes none: nothing is released for nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

PressurePolicy = Literal["yield", "hold"]


@dataclass(frozen=True)
class PressureRule:
    """`pressure_policy`, resolved once when the controller is built."""

    pins_yield: bool  # yield: to any waiting request; hold: as above

    @classmethod
    def named(cls, policy: PressurePolicy) -> PressureRule:
        if policy not in ("yield", "hold"):
            raise ValueError(f"pressure_policy must be 'hold' or 'yield', not {policy!r}")
        return cls(pins_yield=policy == "yield")

    def may_release_pins(
        self,
        for_running_request: bool,
        anything_running: bool,
        *,
        preempted: bool = False,
        overdue: bool = False,
    ) -> bool:
        if for_running_request or preempted or overdue or self.pins_yield:
            return True
        return not anything_running


class HoldsBlocks(Protocol):
    block_ids: tuple[int, ...]


def blocks_freed(
    pins: Sequence[HoldsBlocks], refs: Callable[[int], int], keep: Collection[int] = ()
) -> int:
    """Blocks that releasing all of `pins` frees: every reference to the block
    (`refs(block)`) is one of theirs, and it is not in `keep`."""
    held: Counter[int] = Counter()
    for pin in pins:
        held.update(set(pin.block_ids))
    return sum(1 for b, n in held.items() if n >= refs(b) and b not in keep)


def pins_to_release(
    candidates: Iterable[HoldsBlocks],
    needed: int | None,
    refs: Callable[[int], int],
    keep: Collection[int] = (),
) -> list:
    """The fewest leading candidates (in release order) that free `needed`
    blocks, then pruned of any whose release turns out unnecessary (most
    valuable first). [] if all of them together would not free enough.
    `needed=None` (unknown): every candidate, if together they free anything.
    Candidates are read lazily, only until they cover `needed`: linear in
    the blocks of the candidates read."""
    if needed is None:
        candidates = list(candidates)
        return candidates if blocks_freed(candidates, refs, keep) > 0 else []
    if needed <= 0:
        return []
    held: dict[int, int] = {}  # block -> chosen pins holding it (a dict: no __missing__ call per block)
    count = held.get
    freed = 0
    chosen: list = []
    for pin in candidates:
        chosen.append(pin)
        for b in set(pin.block_ids):
            n = held[b] = count(b, 0) + 1
            if n == refs(b) and b not in keep:
                freed += 1  # its last reference goes
        if freed >= needed:
            break
    else:
        return []
    for pin in reversed(chosen[:-1]):  # the last one was needed to reach the goal
        own = [b for b in set(pin.block_ids) if held[b] == refs(b) and b not in keep]
        if freed - len(own) >= needed:
            chosen.remove(pin)
            for b in set(pin.block_ids):
                held[b] -= 1
            freed -= len(own)
    return chosen

