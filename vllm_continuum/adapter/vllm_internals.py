"""The vLLM internals the block ledger reads, in one place, probed on the
running scheduler.

None of them is an interface vLLM documents: a private method
(`Scheduler._request_blocks_can_be_freed`), the deferred-free fence's
bookkeeping (`defer_block_free`, `sched_step_seq`, `processed_step_seq`,
`deferred_frees`), and the members and parameters of the KV cache manager,
its coordinator and the block pool that the ledger calls, or whose arithmetic
it repeats (`KVCacheManager.allocate_slots`). Every release in
`compat.VERIFIED_RELEASES` has all of them (tests/scheduler/test_vllm_internals.py
runs on each). On a release without one (started with
CONTINUUM_ALLOW_UNVERIFIED_VLLM=1), each missing name is logged once, at
WARNING, with what the plugin does without it, by what it serves:

- `pins`: taking a finished request's blocks, giving them back, weighing the
  pool. Without any of them no pin can be kept safely: the scheduler refuses
  to start (`UnsupportedVLLMError`).
- `pool_state`: `hash_block_size`; without it a block counts one hash.
- `fence`: only when vLLM defers frees (a KV connector, async scheduling).
  Without `_request_blocks_can_be_freed` a pin is fenced at the latest
  scheduled step (never given back early; perhaps one step late). Without
  `defer_block_free`, frees count as not deferred. A scheduler that defers
  frees without the other three refuses to start.
- `shortfall`: vLLM's allocation arithmetic. Without it the blocks a failed
  allocation lacks are unknown (None), and every pin that frees a block is a
  candidate for release, as `VllmBlockLedger.shortfall` says.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from vllm.logger import init_logger

from vllm_continuum.adapter.compat import UnsupportedVLLMError

logger = init_logger("vllm.continuum")

_ALLOCATE_SLOTS_ARGS = (
    "new_computed_blocks", "num_new_computed_tokens", "num_external_computed_tokens",
    "num_new_tokens", "num_lookahead_tokens", "num_encoder_tokens", "full_sequence_must_fit",
    "reserved_blocks", "has_scheduled_reqs",
)
_BLOCKS_TO_ALLOCATE_ARGS = (
    "request_id", "num_tokens", "new_computed_blocks", "num_encoder_tokens",
    "total_computed_tokens", "num_local_computed_tokens", "num_tokens_main_model",
    "apply_admission_cap", "prefill_end",
)
_FENCE_BOOKS = ("sched_step_seq", "processed_step_seq", "deferred_frees")


def _resolve(obj: object, path: str) -> object:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Internal:
    """One name, as a path from the scheduler (`a.b.c`, or `a.b(x, y)`: a
    callable taking those keywords), and what it serves."""

    path: str
    serves: str  # pins | pool_state | fence | shortfall

    def found_on(self, scheduler: object) -> bool:
        path, _, args = self.path.partition("(")
        try:
            target = _resolve(scheduler, path)
            if path.endswith("single_type_managers"):  # each group's manager frees its own
                return all(hasattr(m, "pop_blocks_for_free") for m in target)
            if not args:
                return True
            # The class's method: the scheduler wraps `allocate_slots` per instance.
            owner, _, name = path.rpartition(".")
            target = getattr(type(_resolve(scheduler, owner) if owner else scheduler), name, target)
            params = inspect.signature(target).parameters
        except (AttributeError, TypeError, ValueError):
            return False
        return all(name.strip() in params for name in args.rstrip(")").split(","))


NEEDED: tuple[Internal, ...] = (
    *(Internal(p, "pins") for p in (
        "kv_cache_manager.pop_blocks_for_free",
        "kv_cache_manager.coordinator.single_type_managers",
        "kv_cache_manager.block_pool.free_blocks",
        "kv_cache_manager.block_pool.touch",
        "kv_cache_manager.block_pool.blocks",
        "kv_cache_manager.block_pool.num_gpu_blocks",
        "kv_cache_manager.block_pool.get_num_free_blocks",
        "kv_cache_manager.block_pool.get_cached_block",
        "kv_cache_config.kv_cache_groups",
        "block_size",
        "waiting",
    )),
    Internal("hash_block_size", "pool_state"),
    Internal("_request_blocks_can_be_freed", "fence"),
    Internal("defer_block_free", "fence"),
    *(Internal(p, "fence") for p in _FENCE_BOOKS),
    Internal(f"kv_cache_manager.allocate_slots({', '.join(_ALLOCATE_SLOTS_ARGS)})", "shortfall"),
    *(Internal(f"kv_cache_manager.{p}", "shortfall")
      for p in ("empty_kv_cache_blocks", "max_model_len", "watermark_blocks")),
    Internal("kv_cache_manager.retained_hit_group_ids", "shortfall"),
    Internal("kv_cache_manager.coordinator.get_num_blocks_to_allocate("
             f"{', '.join(_BLOCKS_TO_ALLOCATE_ARGS)})", "shortfall"),
)

WITHOUT = {
    "pins": "no pin can be kept safely: the scheduler does not start",
    "pool_state": "a block counts one hash when `pin_cost: pressure` weighs the queue's demand",
    "_request_blocks_can_be_freed": "a pin is fenced at the latest scheduled step "
                                    "(given back no earlier than vLLM would)",
    "defer_block_free": "frees count as not deferred",
    "fence": "a scheduler that defers frees does not start",
    "shortfall": "a failed allocation's shortfall is unknown: every pin that frees a block "
                 "is a candidate for release",
}
_reported: set[str] = set()


def missing_on(scheduler: object, needed: Iterable[Internal] = NEEDED) -> list[Internal]:
    """The needed internals this scheduler lacks ([] on every verified release)."""
    return [n for n in needed if not n.found_on(scheduler)]


def _report(internal: Internal, version: str) -> None:
    if internal.path in _reported:
        return
    _reported.add(internal.path)
    logger.warning("continuum: vLLM %s has no %s: %s", version, internal.path,
                   WITHOUT.get(internal.path, WITHOUT[internal.serves]))


class VllmInternals:
    """The ledger's access to vLLM's internals, checked once per scheduler."""

    def __init__(self, scheduler: object) -> None:
        import vllm

        self._s = scheduler
        self.missing = missing_on(scheduler)
        for internal in self.missing:
            _report(internal, vllm.__version__)
        lacking = {n.path for n in self.missing}
        unsafe = [n.path for n in self.missing if n.serves == "pins"]
        if self.defers_frees:
            unsafe += [p for p in _FENCE_BOOKS if p in lacking]
        if unsafe:
            raise UnsupportedVLLMError(
                f"vllm-continuum cannot keep pins on vLLM {vllm.__version__}: it has no "
                f"{', '.join(unsafe)}. Install a verified release "
                "(pip install 'vllm-continuum[cpu]' or '[gpu]').")
        self._can_be_freed: Callable | None = getattr(scheduler, "_request_blocks_can_be_freed", None)
        self.shortfall_known = not any(n.serves == "shortfall" for n in self.missing)

    @property
    def defers_frees(self) -> bool:
        return bool(getattr(self._s, "defer_block_free", False))

    def fence(self, request) -> int:
        """0 when the request's blocks may go back to the pool now; else the
        step that must have been processed first."""
        if not self.defers_frees:
            return 0
        if self._can_be_freed is not None and self._can_be_freed(request):
            return 0
        return self._s.sched_step_seq

    def fence_passed(self, fence: int) -> bool:
        return not self.defers_frees or fence <= self._s.processed_step_seq

    def defer_free(self, fence: int, blocks: list) -> None:
        """Queue blocks as vLLM queues a deferred free: returned once `fence` is processed."""
        self._s.deferred_frees.append((fence, blocks))
