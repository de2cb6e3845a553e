"""vLLM's KV offload to host memory, read from the scheduler's KV connector:
the `HostTier` the pin rules price a lost pin by (core/lost_pin.py).

Only vLLM's native `OffloadingConnector` (`--kv-offloading-size`) with its
CPU manager is read, over a model with one full-attention KV cache group;
with any other connector (or none) there is no host tier to read and a lost
pin is priced as a prefill, as without offload.

- What it holds: the manager's `lookup` of a context's offload keys (a
  block hash and its KV cache group, one per offloaded chunk), in order,
  up to the first miss. A chunk being stored counts (`HIT_PENDING`: its
  store was issued). `lookup` is a read (no recency change, nothing
  started); the manager is the scheduler thread's (the CPU manager's lock
  is a no-op).
- How fast it loads: the bytes and copy time of every load the worker
  reported (`OffloadingWorkerMetadata.transfer_stats.load`, the figures
  behind `vllm:kv_offload_load_bytes_total` / `..._time_total`), read as
  vLLM's scheduler receives them, without consuming its stats; before the
  first load, DEFAULT_LOAD_BYTES_PER_S.
- Bytes a token: the offloaded KV cache groups' pages per block.
- Loads: the host tokens vLLM allocated each request to load
  (`num_external_computed_tokens` at allocation), for the resume metrics.
- Keeping a released pin's copy: the manager's `touch` of its keys (as a
  request's finish does), so that the host's LRU evicts it last.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence

logger = logging.getLogger("vllm.continuum")

# Before any load is measured: PCIe 4.0 x16's 31.5 GB/s a direction at 80%
# (assumed, not measured): the slower of the links a GPU server has, so that
# a lost pin is not priced cheaper than it turns out to be.
DEFAULT_LOAD_BYTES_PER_S = 25e9
# Loads measured before the measured rate replaces the default (a few
# blocks' copies are dominated by their fixed cost).
MIN_MEASURED_BYTES = 64 << 20


class ConnectorHostTier:
    def __init__(self, manager, *, group_idx: int, tokens_per_chunk: int, hashes_per_chunk: int,
                 bytes_per_token: float) -> None:
        from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key

        self._manager = manager
        self._miss = LookupResult.MISS
        self._key = make_offload_key
        self.group_idx, self.tokens_per_chunk = group_idx, tokens_per_chunk
        self.hashes_per_chunk = hashes_per_chunk
        self.bytes_per_token = bytes_per_token
        self.load_bytes = 0
        self.load_s = 0.0
        self._loading: dict[str, int] = {}  # request -> host tokens it is loading
        self._context = ReqContext(req_id="continuum-pins")  # whose recency `keep` updates

    @classmethod
    def of(cls, scheduler) -> ConnectorHostTier | None:
        """The host tier of the scheduler's connector, if it is vLLM's native
        offload. Its internals read here are vLLM's, not an interface: if a
        release moved them, the tier is not read (logged once), and a lost
        pin is priced as a prefill, as without offload."""
        side = getattr(getattr(scheduler, "connector", None), "connector_scheduler", None)
        manager = getattr(side, "manager", None)
        try:
            from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
        except ImportError:  # a vLLM without the native offload
            return None
        if not isinstance(manager, CPUOffloadingManager):
            return None
        try:
            return cls._read(scheduler, side, manager)
        except (AttributeError, ImportError, IndexError, TypeError) as exc:
            logger.warning("continuum: vLLM's KV offload connector could not be read (%s): lost "
                           "pins are priced as a prefill, as without offload", exc)
            return None

    @classmethod
    def _read(cls, scheduler, side, manager) -> ConnectorHostTier | None:
        groups = side.config.kv_group_configs
        if len(groups) != 1 or groups[0].sliding_window_size_in_chunks is not None:
            logger.info("continuum: KV offload over %d KV cache groups: lost pins priced as a "
                        "prefill (only one full-attention group is read)", len(groups))
            return None
        group = groups[0]
        spec = scheduler.kv_cache_config.kv_cache_groups[group.group_idx]
        page = spec.kv_cache_spec.page_size_bytes * len(spec.layer_names)
        return cls(manager, group_idx=group.group_idx, tokens_per_chunk=group.tokens_per_chunk,
                   hashes_per_chunk=group.hashes_per_chunk,
                   bytes_per_token=page / group.tokens_per_block)

    # --- core/lost_pin.py's HostTier -----------------------------------------
    def held_tokens(self, hashes: Sequence[Hashable], num_tokens: int) -> int:
        held = 0
        for key in self._keys(hashes):
            if self._manager.lookup(key, self._context) is self._miss:
                break
            held += self.tokens_per_chunk
        return min(held, num_tokens)

    def reload_s(self, num_tokens: int) -> float:
        return num_tokens * self.bytes_per_token / self.load_bytes_per_s

    def loaded_tokens(self, request_id: str) -> int:
        return self._loading.pop(request_id, 0)

    def keep(self, hashes: Sequence[Hashable]) -> None:
        keys = list(self._keys(hashes))
        if keys:
            self._manager.touch(keys, self._context)

    def _keys(self, hashes: Sequence[Hashable]):
        """The offload keys of a context's chunks, in order (a chunk is keyed by
        its last block hash, as the connector keys it)."""
        per = self.hashes_per_chunk
        return (self._key(hashes[last], self.group_idx) for last in range(per - 1, len(hashes), per))
    # --- what the adapter tells it -------------------------------------------
    @property
    def load_bytes_per_s(self) -> float:
        if self.load_bytes < MIN_MEASURED_BYTES or self.load_s <= 0:
            return DEFAULT_LOAD_BYTES_PER_S
        return self.load_bytes / self.load_s

    def allocated(self, request_id: str, num_external_tokens: int) -> None:
        """vLLM allocated a request to load that many tokens from the tier."""
        if num_external_tokens > 0:
            self._loading[request_id] = num_external_tokens

    def forget(self, request_id: str) -> None:
        self._loading.pop(request_id, None)

    def observe(self, kv_connector_output) -> None:
        """A step's connector output: the loads its worker completed."""
        stats = getattr(getattr(kv_connector_output, "kv_connector_worker_meta", None),
                        "transfer_stats", None)
        load = getattr(stats, "load", None)
        if load is not None and load.bytes > 0 and load.time > 0:
            self.load_bytes += load.bytes
            self.load_s += load.time
