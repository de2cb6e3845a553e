"""vLLM's KV offload to host memory at the scheduler level: the real
`OffloadingConnector` (its scheduler side, `CPUOffloadingSpec` and LRU
`CPUOffloadingManager`) with a scripted worker side.

`ScriptedOffloadWorker` stands for `OffloadingConnectorWorker`: it is given
each step's `OffloadingConnectorMetadata` and reports, at that step's
output, the jobs it completed (`OffloadingWorkerMetadata.completed_jobs`) and
the requests whose loads are done (`finished_recving`), as vLLM's worker
does. A job completes at the output of the step that issued it, unless its
kind is held (`hold`: "load", "store") until `release`; a job the scheduler
asks to flush (`jobs_to_flush`: a block with a store pending was
reallocated) always completes in that step, as vLLM's worker waits for it
before the forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HOST_BLOCKS = 256


def offload_transfer_config(host_blocks: int = HOST_BLOCKS, **extra):
    """`--kv-offloading-size` as vLLM builds it (native backend), sized in blocks
    of the harness's fake KV cache (driver.page_size_bytes)."""
    from vllm.config import KVTransferConfig

    from tests.scheduler.harness import BLOCK_SIZE
    from continuum_lab.sim.driver import page_size_bytes

    return KVTransferConfig(
        kv_connector="OffloadingConnector", kv_role="kv_both",
        kv_connector_extra_config={"cpu_bytes_to_use": host_blocks * page_size_bytes(BLOCK_SIZE),
                                   **extra})


@dataclass
class ScriptedOffloadWorker:
    hold: set[str] = field(default_factory=set)
    pending: dict[int, str | None] = field(default_factory=dict)  # job -> its load's request
    loads: dict[str, int] = field(default_factory=dict)  # request -> blocks it loaded
    stored_blocks: int = 0
    flushed: set[int] = field(default_factory=set)
    _now: set[int] = field(default_factory=set)  # completed in the step in flight

    def scheduled(self, meta) -> None:
        for job_id in meta.jobs_to_flush or ():
            if job_id in self.pending or job_id in meta.store_jobs:
                self.flushed.add(job_id)
                self._now.add(job_id)
        for job_id, entry in meta.store_jobs.items():
            self.pending[job_id] = None
            self.stored_blocks += len(entry.src_spec.block_ids)
        for job_id, entry in meta.load_jobs.items():
            self.pending[job_id] = entry.req_id
            self.loads[entry.req_id] = self.loads.get(entry.req_id, 0) + len(entry.dst_spec.block_ids)

    def release(self, kind: str) -> None:
        self.hold.discard(kind)

    def output(self) -> dict:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )

        done = {job_id for job_id, req in self.pending.items()
                if ("load" if req is not None else "store") not in self.hold} | self._now
        self._now = set()
        meta = OffloadingWorkerMetadata()
        recving = set()
        for job_id in done:
            req = self.pending.pop(job_id, None)
            meta.mark_completed(job_id)
            if req is not None:
                recving.add(req)
        return {"finished_recving": recving,
                "kv_connector_worker_meta": meta if meta.completed_jobs else None}

    @property
    def busy(self) -> bool:
        return bool(self.pending)


def connector_state(scheduler) -> tuple[int, int]:
    """(jobs, request states) the connector's scheduler side still keeps."""
    side = scheduler.connector.scheduler
    return len(side._jobs), len(side._req_status)
