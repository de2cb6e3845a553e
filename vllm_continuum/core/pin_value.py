"""What a pin costs given the demand the pool actually sees.

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

Release by value (the least P(return within the rest of the TTL | not yet)
x benefit per freed block first) was measured too and dropped: no better
than releasing the latest program's pins (docs/results/benchmarks-archive.md).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class PoolState:
    """The pool's state when a turn ends, from the adapter."""

    free_blocks: int  # allocatable now: free plus cached blocks no request holds
    demand_blocks: int  # what the waiting requests still need allocated (prefix hits excluded)


def demand_exceeds_free(pool: PoolState | None) -> bool:
    """Whether the waiting demand needs more than the free pool: only then does
    a pin's count of marginal blocks change its pressure (else it is 0)."""
    return pool is not None and pool.demand_blocks > pool.free_blocks


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
