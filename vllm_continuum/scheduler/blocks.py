"""Taking, returning and weighing KV block references: the only code that
touches vLLM's block pool.

A pin holds exactly the references a finished request held, taken with
`pop_blocks_for_free` (upstream's own "pop now, free later" path). Giving
them back respects upstream's deferred-free fence, so a block that an
in-flight step may still write is never handed to another request early.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.scheduler import Scheduler


class BlockLedger:
    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._pool = scheduler.kv_cache_manager.block_pool

    @property
    def pool_size(self) -> int:
        """Usable blocks (vLLM reserves block 0 as the null block)."""
        return self._pool.num_gpu_blocks - 1

    def num_free(self) -> int:
        return self._pool.get_num_free_blocks()

    def take(self, request) -> tuple[list[KVCacheBlock], int]:
        """Take over a finished request's block references; return them and their fence."""
        s = self._scheduler
        fence = 0 if s._request_blocks_can_be_freed(request) else s.sched_step_seq
        return s.kv_cache_manager.pop_blocks_for_free(request), fence

    def give_back(self, blocks: Sequence[KVCacheBlock], fence: int) -> None:
        s = self._scheduler
        if not s.defer_block_free or fence <= s.processed_step_seq:
            # Reverse order: the tail of a prompt is evicted first, as upstream does.
            self._pool.free_blocks(reversed(blocks))
        else:
            s.deferred_frees.append((fence, list(blocks)))

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
        s = self._scheduler
        return not s.defer_block_free or fence <= s.processed_step_seq

    @staticmethod
    def count(blocks: Iterable[KVCacheBlock]) -> int:
        return sum(1 for b in blocks if not b.is_null)

    @staticmethod
    def freeable(blocks: Iterable[KVCacheBlock], exclude_ids: Collection[int]) -> int:
        """Blocks that releasing would actually free: held by nothing else and not
        about to be reused by the request that needs room."""
        return sum(
            1
            for b in blocks
            if not b.is_null and b.ref_cnt == 1 and b.block_id not in exclude_ids
        )

    @staticmethod
    def block_ids(kv_cache_blocks) -> frozenset[int]:
        """Ids in a `KVCacheBlocks` (a request's prefix hit), across groups."""
        if kv_cache_blocks is None:
            return frozenset()
        return frozenset(b.block_id for group in kv_cache_blocks.blocks for b in group)
