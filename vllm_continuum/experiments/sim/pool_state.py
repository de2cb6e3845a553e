"""The pool's state as `pin_cost: pressure` reads it, from vLLM's scheduler.

`PinController` asks its `pool_state` callable when it decides a pin's TTL
(core/pin_value.py): how many blocks an allocation could take now, and how
many the waiting requests still need. The simulator supplies it here from
the scheduler it drives, the way the adapter is to supply it on a live
engine (until then a live engine runs `pin_cost: pressure` as Eq. 2).

- free: vLLM's free block queue, which holds the evictable cached blocks too.
- demand: per waiting request, the blocks of its tokens less its prefix hit
  (the leading block hashes found in the prefix cache; found by bisection,
  as hits are a prefix).
"""

from __future__ import annotations

from vllm_continuum.core.pin_value import PoolState


def _cached_prefix_blocks(pool, block_hashes) -> int:
    lo, hi = 0, len(block_hashes)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pool.get_cached_block(block_hashes[mid - 1], [0]) is not None:
            lo = mid
        else:
            hi = mid - 1
    return lo


def vllm_pool_state(scheduler) -> PoolState:
    pool = scheduler.kv_cache_manager.block_pool
    size = scheduler.block_size
    demand = 0
    for request in scheduler.waiting:
        blocks = -(-request.num_tokens // size)
        demand += max(0, blocks - _cached_prefix_blocks(pool, request.block_hashes))
    return PoolState(free_blocks=pool.get_num_free_blocks(), demand_blocks=demand)
