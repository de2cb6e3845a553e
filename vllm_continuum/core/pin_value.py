"""What a pin costs given the demand the pool actually sees, and what it is
still worth when pressure must take some pins back.

Cost. Eq. 2 charges a pin tau seconds of its memory as if that memory always
kept someone out. It only does when the waiting requests need more blocks
than are free: `pin_pressure` is the fraction of the pin's *marginal* blocks
(those no other pin or running request holds: the rest cost nothing extra)
that the waiting demand would use if the pin were not made,

    pressure = clamp(demand - free, 0, m) / m,

with `free` the blocks an allocation could take now (free and evictable
cached ones) and `demand` the blocks the waiting queue still needs. The TTL
is then Eq. 2 with the cost scaled by it, i.e. with the benefit divided by
it: a quiet server pins until the slowest call returns (`max_ttl_s` caps it),
a saturated one exactly as Eq. 2.

Value. Under pressure, the pin to release first is the one whose blocks buy
the least: P(its tool returns within the rest of its TTL | not returned
yet) x its benefit (the reload and queueing its return saves) per marginal
block, the block its release actually frees.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from vllm_continuum.core.pin_table import Pin


@dataclass(frozen=True)
class PoolState:
    """The pool's state when a turn ends, from the adapter."""

    free_blocks: int  # allocatable now: free plus cached blocks no request holds
    demand_blocks: int  # what the waiting requests still need allocated (prefix hits excluded)


def pin_pressure(pool: PoolState | None, marginal_blocks: int) -> float:
    """The fraction of a new pin's marginal blocks that waiting demand needs:
    1.0 without pool information (Eq. 2's assumption), 0.0 for a pin that
    adds no block."""
    if pool is None:
        return 1.0
    if marginal_blocks <= 0:
        return 0.0
    kept_out = min(max(pool.demand_blocks - pool.free_blocks, 0), marginal_blocks)
    return kept_out / marginal_blocks


def marginal_blocks(block_ids: Iterable[int], refs: Callable[[int], int], keep: Collection[int] = ()) -> int:
    """Blocks only this holder references (`refs(b) <= 1`): what releasing it frees."""
    return sum(1 for b in set(block_ids) if refs(b) <= 1 and b not in keep)


def release_by_value(
    pins: Sequence[Pin],
    now: float,
    p_return: Callable[[Pin, float, float], float],
    refs: Callable[[int], int],
    keep: Collection[int] = (),
) -> list[Pin]:
    """`pins`, least expected benefit per marginal block first (ties keep the
    given order). `p_return(pin, age, remaining)`: P(its tool returns within
    `remaining` seconds | out for `age`). A pin whose release frees nothing
    goes last."""

    def value_per_block(pin: Pin) -> float:
        m = marginal_blocks(pin.block_ids, refs, keep)
        if m == 0:
            return math.inf
        age = max(0.0, now - pin.created_at)
        remaining = max(0.0, pin.expires_at - now)
        return p_return(pin, age, remaining) * pin.benefit_s / m

    return sorted(pins, key=value_per_block)
