"""Taking, returning and weighing KV block references: the only code that
touches vLLM's block pool (`vllm_continuum.core.ledger.BlockLedger` over it).

Every vLLM internal it reads beyond these classes' methods is reached
through `vllm_internals.VllmInternals`, checked when the scheduler starts.

A pin holds exactly the references a finished request held, taken with
`pop_blocks_for_free` (upstream's own "pop now, free later" path). Giving
them back respects upstream's deferred-free fence, so a block that an
in-flight step may still write is never handed to another request early,
and follows stock's order, so that eviction afterwards is stock's: each KV
cache group's blocks tail first, group after group (`KVCacheManager.free`),
or, through the deferred-free queue, as stock queues them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from vllm.logger import init_logger
from vllm.v1.request import RequestStatus

from vllm_continuum.adapter.vllm_internals import VllmInternals
from vllm_continuum.core.ledger import hashes_per_block
from vllm_continuum.core.pin_value import PoolState

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request


logger = init_logger("vllm.continuum")


class VllmBlockLedger:
    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._internals = VllmInternals(scheduler)
        self._shortfall_failed = False  # logged at WARNING once
        self._pool = scheduler.kv_cache_manager.block_pool
        self._allocate_signature = inspect.signature(scheduler.kv_cache_manager.allocate_slots)
        params = list(self._allocate_signature.parameters.values())
        # Its parameters are all positional-or-keyword (0.32, 0.33): arguments are
        # bound by name without Signature.bind's cost (tens of us per failed allocation).
        self._allocate_plain = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)
        self._allocate_names = tuple(p.name for p in params)
        self._allocate_defaults = {p.name: p.default for p in params if p.default is not p.empty}
        self._managers = scheduler.kv_cache_manager.coordinator.single_type_managers
        # Several KV cache groups (sliding window, hybrid): the group each taken
        # block belongs to, so that it goes back in stock's order.
        self._group_of: dict[int, int] | None = {} if len(self._managers) > 1 else None

    @property
    def pool_size(self) -> int:
        """Usable blocks (vLLM reserves block 0 as the null block)."""
        return self._pool.num_gpu_blocks - 1

    def num_free(self) -> int:
        return self._pool.get_num_free_blocks()

    def take(self, request) -> tuple[list[KVCacheBlock], int]:
        """Take over a finished request's block references; return them (group
        after group, as `pop_blocks_for_free` does) and their fence."""
        s = self._scheduler
        fence = self._internals.fence(request)
        if self._group_of is None:
            return s.kv_cache_manager.pop_blocks_for_free(request), fence
        blocks: list[KVCacheBlock] = []
        for group, manager in enumerate(self._managers):
            taken = manager.pop_blocks_for_free(request.request_id)
            self._group_of.update((b.block_id, group) for b in taken)
            blocks += taken
        return blocks, fence

    def give_back(self, blocks: Sequence[KVCacheBlock], fence: int) -> None:
        if not blocks:
            return  # (a pin that keeps all its blocks gives back none)
        if not self._internals.fence_passed(fence):
            self._internals.defer_free(fence, list(blocks))  # as stock defers a free
            return
        if self._group_of is None:
            # Reverse order: the tail of a prompt is evicted first, as upstream does.
            self._pool.free_blocks(reversed(blocks))
            return
        by_group: dict[int, list[KVCacheBlock]] = {}
        for block in blocks:
            by_group.setdefault(self._group_of.get(block.block_id, 0), []).append(block)
        for group in sorted(by_group):  # as KVCacheCoordinator.free: group after group
            self._pool.free_blocks(reversed(by_group[group]))

    def take_back(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Undo `give_back` of blocks nobody has allocated since.

        `touch` mirrors `free_blocks` exactly (null blocks included), per pool.
        """
        by_pool: dict[object, list[KVCacheBlock]] = {}
        for block in blocks:
            by_pool.setdefault(getattr(block, "pool", None) or self._pool, []).append(block)
        for pool, pool_blocks in by_pool.items():
            pool.touch(pool_blocks)

    def can_give_back_now(self, fence: int) -> bool:
        return self._internals.fence_passed(fence)

    @staticmethod
    def ids(blocks: Iterable[KVCacheBlock], keep_null: bool = False) -> tuple:
        """Block ids in order; null blocks (sliding window, padding) are
        skipped, or given as None with `keep_null` (positions preserved)."""
        if keep_null:
            return tuple(None if b.is_null else b.block_id for b in blocks)
        return tuple(b.block_id for b in blocks if not b.is_null)

    def ref_count(self, block_id: int) -> int:
        return self._pool.blocks[block_id].ref_cnt

    @staticmethod
    def block_ids(kv_cache_blocks) -> frozenset[int]:
        """Ids in a `KVCacheBlocks` (a request's prefix hit), across groups."""
        if kv_cache_blocks is None:
            return frozenset()
        return frozenset(b.block_id for group in kv_cache_blocks.blocks for b in group)

    def pool_state(self, counted: Callable[[Request], bool] = lambda r: True) -> PoolState:
        """What `pin_cost: pressure` weighs a pin against: the blocks an
        allocation could take now (vLLM's free queue holds the evictable cached
        blocks too), and what the `counted` queued requests still need: per
        request, its blocks less its prefix hit (the leading block hashes the
        prefix cache holds, found by bisection, as hits are a prefix).
        O(waiting x log blocks)."""
        s = self._scheduler
        groups = list(range(len(s.kv_cache_config.kv_cache_groups)))
        per_block = hashes_per_block(s.block_size, getattr(s, "hash_block_size", None))
        demand = 0
        for request in s.waiting:
            if not counted(request):
                continue
            hashes = request.block_hashes
            lo, hi = 0, len(hashes) // per_block
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._pool.get_cached_block(hashes[mid * per_block - 1], groups) is not None:
                    lo = mid
                else:
                    hi = mid - 1
            demand += max(0, -(-request.num_tokens // s.block_size) - lo)
        return PoolState(free_blocks=self._pool.get_num_free_blocks(), demand_blocks=demand)

    def shortfall(self, request, args: tuple, kwargs: dict) -> int | None:
        """How many more free blocks the failed `allocate_slots(request, *args,
        **kwargs)` needed: vLLM's own arithmetic (KVCacheManager.allocate_slots,
        identical in 0.32 and 0.33), asked once instead of retrying per pin.
        None where it cannot be told (then every pin that frees a block is a
        candidate)."""
        if not self._internals.shortfall_known:
            return None
        try:
            return self._shortfall(request, args, kwargs)
        except Exception:  # an internal API moved: fall back, never fail the step
            if not self._shortfall_failed:
                self._shortfall_failed = True
                logger.warning("continuum: vLLM's allocation arithmetic failed; a failed "
                               "allocation's shortfall counts as unknown", exc_info=True)
            logger.debug("continuum: shortfall unknown for %s", request.request_id, exc_info=True)
            return None

    def _allocate_arguments(self, request, args: tuple, kwargs: dict) -> dict:
        """`allocate_slots(request, *args, **kwargs)`'s arguments by name, defaults
        included: what `Signature.bind` + `apply_defaults` give (the call itself
        has just bound them, so nothing is missing, unknown or given twice)."""
        if not self._allocate_plain:
            bound = self._allocate_signature.bind(request, *args, **kwargs)
            bound.apply_defaults()
            return bound.arguments
        arguments = dict(self._allocate_defaults)
        arguments.update(zip(self._allocate_names, (request, *args)))
        arguments.update(kwargs)
        return arguments

    def _shortfall(self, request, args: tuple, kwargs: dict) -> int | None:
        kvm = self._scheduler.kv_cache_manager
        if getattr(kvm, "retained_hit_group_ids", None):
            return None
        a = self._allocate_arguments(request, args, kwargs)
        hit = a["new_computed_blocks"]
        hit_blocks = hit.blocks if hit is not None else kvm.empty_kv_cache_blocks.blocks
        local = request.num_computed_tokens + a["num_new_computed_tokens"]
        external = a["num_external_computed_tokens"]
        total = min(local + external, kvm.max_model_len)
        waiting = request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        watermark = kvm.watermark_blocks if a["has_scheduled_reqs"] and waiting else 0
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        free = self._pool.get_num_free_blocks()
        common = dict(
            request_id=request.request_id, new_computed_blocks=hit_blocks,
            num_encoder_tokens=a["num_encoder_tokens"], num_local_computed_tokens=local,
            prefill_end=prefill_end,
        )
        short = 0
        if a["full_sequence_must_fit"]:
            full = min(request.num_tokens, kvm.max_model_len)
            need = kvm.coordinator.get_num_blocks_to_allocate(
                num_tokens=full, total_computed_tokens=total, num_tokens_main_model=full,
                apply_admission_cap=True, **common,
            )
            short = need + watermark - free
        main = total + a["num_new_tokens"]
        need = kvm.coordinator.get_num_blocks_to_allocate(
            num_tokens=min(main + a["num_lookahead_tokens"], kvm.max_model_len),
            total_computed_tokens=local + external, num_tokens_main_model=main, **common,
        )
        short = max(short, need + watermark - (free - a["reserved_blocks"]))
        return short if short > 0 else None  # <= 0 contradicts the failure: unknown
