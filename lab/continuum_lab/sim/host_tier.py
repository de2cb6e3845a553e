"""vLLM's KV offload to host memory, in the simulator: the real connector's
scheduler side with a worker that moves blocks in simulated time.

A simulated engine with a host tier is built with vLLM's own
`OffloadingConnector` (`kv_transfer_config`, the `CPUOffloadingSpec` and its
LRU `CPUOffloadingManager`), so what is stored, looked up, loaded, evicted
and fenced is vLLM's decision (vllm/distributed/kv_transfer/kv_connector/v1/
offloading/scheduler.py). Only the worker side is modelled here
(`OffloadWorker`), after vLLM's `OffloadingConnectorWorker` and its CPU
worker (`kv_offload/cpu/gpu_worker.py`), as model runner V2 (0.33's default
on a GPU) drives them:

- two directions, each a FIFO of copies (a copy starts when the one before it
  ends), the two running at once; a copy of b blocks takes
  b * kv_bytes_per_block / bandwidth;
- a step's store jobs are submitted at the next step's start (vLLM defers
  them "so that offloading starts AFTER transfers related to token
  sampling"); a finished request's last blocks are stored one schedule later
  still (the scheduler builds those jobs after `request_finished`);
- `jobs_to_flush` (a freed block with a store pending was reallocated) are
  waited for before the step's forward: the step starts when they are done;
- loads are submitted after the forward of the step that scheduled them
  and run asynchronously: the request waits in `WAITING_FOR_REMOTE_KVS`
  until a step's end finds its copy done (`finished_recving`), and is
  scheduled at the next step; 0.33's synchronous loads
  (`sync_load_budget_bytes`, off by default) are waited for before the forward;
- completed jobs go back to the scheduler as vLLM's worker reports them
  (`OffloadingWorkerMetadata`: completed jobs, bytes and copy time).

A step during which copies run takes longer (`Interference`): the copies
share the GPU's memory bandwidth (DMA) or, with copy kernels, its SMs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Effective bandwidth of one direction of a x16 link, bytes/s. Raw: PCIe 4.0
# 31.5 GB/s, PCIe 5.0 63 GB/s per direction (PCI-SIG); effective assumed at
# 80% of raw (protocol overhead, pinned-memory DMA), not measured here. vLLM
# measures it: `vllm:kv_offload_load_bytes_total / ..._time_total`.
BANDWIDTH = {"pcie4": 25e9, "pcie5": 50e9}


@dataclass(frozen=True)
class Interference:
    """The extra fraction of a step's time while copies of a direction run."""

    load: float
    store: float
    source: str


INTERFERENCE = {
    # The native connector copies Llama-3.1-8B's 64 KiB pages by DMA
    # (`_select_swap_blocks_fn`: pages >= 28 KiB use cuMemcpyBatchAsync):
    # a copy takes its bandwidth from HBM, 50 GB/s of the 2.68 TB/s a
    # memory-bound step reads (3.35 TB/s at the cost model's 80%): +2%.
    "dma": Interference(0.02, 0.02, "DMA copies share HBM bandwidth: 50 / 2680 GB/s"),
    # A published nsys trace of the simple CPU offload connector on an H100:
    # decode steps of 15 ms took 24 ms with loads and 42 ms with loads and
    # stores (+60%, then +120% more).
    "contended": Interference(0.6, 1.2, "nsys trace of the simple connector on an H100: "
                              "15 ms steps, 24 ms with loads, 42 ms with loads and stores"),
}


@dataclass(frozen=True)
class HostTier:
    """A host tier: its capacity against the GPU pool, its link, its interference."""

    capacity: float = 1.0  # host blocks / GPU pool blocks
    bus: str = "pcie5"
    interference: str = "dma"
    offload_prompt_only: bool = True  # vLLM's default: outputs are never stored

    @property
    def bandwidth(self) -> float:
        return BANDWIDTH[self.bus]

    @property
    def label(self) -> str:
        """The label suffix that names this tier (`parse` reads it back)."""
        parts = [f"{self.capacity:g}x", self.bus]
        if self.interference != "dma":
            parts.append(self.interference)
        if not self.offload_prompt_only:
            parts.append("outputs")
        return "-".join(parts)

    @classmethod
    def parse(cls, suffix: str) -> HostTier:
        """'' (1x, pcie5, dma) or tokens joined by '-': `3x`, `pcie4`,
        `contended`, `outputs` (outputs stored too: offload_prompt_only off)."""
        fields: dict = {}
        for token in filter(None, suffix.split("-")):
            if m := re.fullmatch(r"(\d+(?:\.\d+)?)x", token):
                fields["capacity"] = float(m.group(1))
            elif token in BANDWIDTH:
                fields["bus"] = token
            elif token in INTERFERENCE:
                fields["interference"] = token
            elif token == "outputs":
                fields["offload_prompt_only"] = False
            else:
                raise ValueError(f"host tier {suffix!r}: {token!r} is none of Nx, "
                                 f"{', '.join(BANDWIDTH)}, {', '.join(INTERFERENCE)}, outputs")
        tier = cls(**fields)
        if tier.capacity <= 0:
            raise ValueError(f"host tier {suffix!r}: capacity must be positive")
        return tier

    def num_chunks(self, num_gpu_blocks: int) -> int:
        return max(1, round(self.capacity * num_gpu_blocks))

    def kv_transfer_config(self, num_gpu_blocks: int, block_size: int, kv_bytes_per_token: int):
        """vLLM's config of the native offload (`--kv-offloading-size`), its host
        buffer sized for `num_chunks` blocks of the simulated KV cache."""
        from vllm.config import KVTransferConfig
        from vllm.utils.math_utils import round_up
        from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

        from continuum_lab.sim.driver import page_size_bytes

        page = page_size_bytes(block_size, kv_bytes_per_token)
        chunk = round_up(page, CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT)
        return KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={
                "cpu_bytes_to_use": self.num_chunks(num_gpu_blocks) * chunk,
                "offload_prompt_only": self.offload_prompt_only,
            })


LOAD, STORE = "load", "store"


@dataclass
class _Copy:
    job_id: int
    direction: str
    blocks: int
    start: float
    end: float
    req_id: str | None  # a load's request (None: a store, or a synchronous load)


@dataclass
class TierStats:
    """What the host tier did in a run (per direction: jobs, blocks, busy seconds)."""

    jobs: dict[str, int] = field(default_factory=lambda: {LOAD: 0, STORE: 0})
    blocks: dict[str, int] = field(default_factory=lambda: {LOAD: 0, STORE: 0})
    busy_s: dict[str, float] = field(default_factory=lambda: {LOAD: 0.0, STORE: 0.0})
    flush_wait_s: float = 0.0  # steps held for `jobs_to_flush`
    interference_s: float = 0.0  # step time added by copies
    loaded_tokens: dict[str, int] = field(default_factory=dict)  # request -> tokens loaded

    def as_dict(self) -> dict:
        return {"jobs": self.jobs, "blocks": self.blocks, "busy_s": self.busy_s,
                "flush_wait_s": self.flush_wait_s, "interference_s": self.interference_s}


class OffloadWorker:
    """The worker side of vLLM's `OffloadingConnector`, on the simulated clock
    (the module's docstring). `start` before a step's forward, `finish` after."""

    def __init__(self, tier: HostTier, bytes_per_block: float, block_size: int) -> None:
        self.tier = tier
        self.bytes_per_block = bytes_per_block
        self.block_size = block_size
        self._free_at = {LOAD: 0.0, STORE: 0.0}  # when each direction's FIFO drains
        self._copies: dict[int, _Copy] = {}  # in flight or done, not yet reported
        self._deferred: list[tuple[int, int]] = []  # stores (job, blocks) for the next step
        self.stats = TierStats()

    def _submit(self, job_id: int, direction: str, blocks: int, req_id: str | None,
                now: float) -> _Copy:
        start = max(now, self._free_at[direction])
        end = start + blocks * self.bytes_per_block / self.tier.bandwidth
        self._free_at[direction] = end
        copy = _Copy(job_id, direction, blocks, start, end, req_id)
        self._copies[job_id] = copy
        self.stats.jobs[direction] += 1
        self.stats.blocks[direction] += blocks
        self.stats.busy_s[direction] += end - start
        return copy

    def _wait(self, job_ids, now: float) -> float:
        return max([now] + [self._copies[j].end for j in job_ids if j in self._copies])

    def start(self, meta, now: float) -> float:
        """A step's start (`handle_preemptions`): the stores deferred from the
        step before are submitted, with any store the scheduler asks to
        flush, which the step waits for; so are 0.33's synchronous loads.
        Returns when the forward can start."""
        flush = set(meta.jobs_to_flush or ())
        for job_id in flush:
            entry = meta.store_jobs.pop(job_id, None)
            if entry is not None:
                self._deferred.append((job_id, len(entry.src_spec.block_ids)))
        for job_id, blocks in self._deferred:
            self._submit(job_id, STORE, blocks, None, now)
        self._deferred.clear()
        t = self._wait(flush, now)
        self.stats.flush_wait_s += t - now
        sync = [job_id for job_id, entry in meta.load_jobs.items() if getattr(entry, "sync", False)]
        for job_id in sync:
            self._submit(job_id, LOAD, len(meta.load_jobs[job_id].dst_spec.block_ids), None, t)
        return self._wait(sync, t)

    def extra_step_s(self, start: float, step_s: float) -> float:
        """What copies running from `start` add to a step of `step_s` alone."""
        rates = INTERFERENCE[self.tier.interference]
        extra = sum(rate * min(step_s, max(0.0, self._free_at[d] - start))
                    for d, rate in ((LOAD, rates.load), (STORE, rates.store)))
        self.stats.interference_s += extra
        return extra

    def finish(self, meta, end: float, *, idle: bool = False):
        """A step's end (`post_forward`): its async loads are submitted, its
        stores deferred to the next step (submitted now if `idle`: an engine
        with nothing to run steps again at once), and the copies done by
        `end` reported. Returns vLLM's `KVConnectorOutput`."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput

        for job_id, entry in meta.load_jobs.items():
            if not getattr(entry, "sync", False):
                self._submit(job_id, LOAD, len(entry.dst_spec.block_ids), entry.req_id, end)
                tokens = self.stats.loaded_tokens.get(entry.req_id, 0)
                self.stats.loaded_tokens[entry.req_id] = (
                    tokens + len(entry.dst_spec.block_ids) * self.block_size)
        self._deferred.extend((job_id, len(entry.src_spec.block_ids))
                              for job_id, entry in meta.store_jobs.items())
        if idle:
            for job_id, blocks in self._deferred:
                self._submit(job_id, STORE, blocks, None, end)
            self._deferred.clear()
        worker_meta = OffloadingWorkerMetadata()
        recving: set[str] = set()
        for copy in [c for c in self._copies.values() if c.end <= end]:
            del self._copies[copy.job_id]
            worker_meta.mark_completed(copy.job_id)
            stats = getattr(worker_meta.transfer_stats, copy.direction)
            stats.record(round(copy.blocks * self.bytes_per_block), copy.end - copy.start)
            if copy.req_id is not None:
                recving.add(copy.req_id)
        return KVConnectorOutput(
            finished_recving=recving or None,
            kv_connector_worker_meta=worker_meta if worker_meta.completed_jobs else None)

    def next_done(self) -> float | None:
        """When the next copy in flight is done (None: none in flight)."""
        return min((c.end for c in self._copies.values()), default=None)

    @property
    def busy(self) -> bool:
        return bool(self._copies or self._deferred)
