"""A host tier for vLLM's KV offload that runs on the CPU build: test and
benchmark use only, never a product feature.

vLLM's `OffloadingConnector` stores every full block of a running request
in host memory and loads an evicted prefix back (docs/offload.md). On the
CPU build it does not start: its `CPUOffloadingSpec.get_worker` refuses any
platform but CUDA-alike and XPU ("CPU Offloading is currently only
supported on CUDA-alike and XPU GPUs"), and its copies are CUDA streams and
events. The connector loads its spec from any module named by the
`spec_name` / `spec_module_path` extra config, so this spec is vLLM's own
`CPUOffloadingSpec` (the same capacity from `cpu_bytes_to_use`, the same
scheduler side, the same LRU manager and metrics) with one part swapped:
its worker copies blocks with plain torch indexing, synchronously, in the
step that submits them. Everything the scheduler sees (jobs, completions,
`finished_recving`, transfer bytes and time) follows vLLM's protocol.

What differs from a GPU's copies: a copy finishes in the step it was
submitted, so a load never keeps a request waiting past one step, and a
store's time is spent inside the model's step rather than beside it (the
interference a GPU's copy engine mostly hides). Host-to-host copies on this
CPU cost memory bandwidth, not PCIe's.

Start a server with it (`host_tier_args` builds these flags):

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "OffloadingConnector",
        "kv_role": "kv_both", "kv_connector_extra_config": {"cpu_bytes_to_use": 268435456,
        "block_size": 32, "spec_name": "TorchCopyOffloadingSpec",
        "spec_module_path": "continuum_lab.host_tier"}}'
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

logger = logging.getLogger("vllm.continuum_lab.host_tier")


class TorchCopyWorker(OffloadingWorker):
    """vLLM's `CPUOffloadingWorker` with synchronous torch copies: the host
    tier is one tensor of `num_chunks * blocks_per_chunk` block rows per KV
    tensor (vLLM's layout of `num_chunks` rows of `blocks_per_chunk` blocks,
    viewed a block a row); each job copies, for every KV cache group and
    every layer reference of it, the reference's page bytes of each block."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int):
        self._blocks_per_chunk = blocks_per_chunk
        self._refs = kv_caches.group_data_refs
        self._device = [t.tensor.view(torch.int8).view(-1, t.page_size_bytes)
                        for t in kv_caches.tensors]
        self._host = [torch.zeros(num_chunks * blocks_per_chunk, t.shape[1], dtype=torch.int8)
                      for t in self._device]
        self._finished: list[TransferResult] = []

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._copy(job_id, src_spec, dst_spec, to_host=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._copy(job_id, dst_spec, src_spec, to_host=False)

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        """Nothing to wait for: every copy finished when it was submitted."""

    def _copy(self, job_id: int, device: GPULoadStoreSpec, host: LoadStoreSpec, to_host: bool) -> bool:
        started = time.perf_counter()
        moved = 0
        device_at = host_at = 0
        for group, (size, first) in enumerate(zip(device.group_sizes, device.block_indices)):
            if size == 0:
                continue
            # The group's first block may sit mid-chunk: skip the chunk's earlier blocks.
            skip = first % self._blocks_per_chunk
            chunks = -(-(size + skip) // self._blocks_per_chunk)
            rows = self._host_rows(host.block_ids[host_at:host_at + chunks])[skip:skip + size]
            blocks = torch.from_numpy(device.block_ids[device_at:device_at + size].astype(np.int64))
            for ref in self._refs[group]:
                width = ref.page_size_bytes
                dev, hst = self._device[ref.tensor_idx], self._host[ref.tensor_idx]
                if to_host:
                    hst[rows, :width] = dev[blocks, :width]
                else:
                    dev[blocks, :width] = hst[rows, :width]
                moved += size * width
            device_at += size
            host_at += chunks
        assert device_at == len(device.block_ids) and host_at == len(host.block_ids)
        self._finished.append(TransferResult(job_id, True, moved, time.perf_counter() - started))
        return True

    def _host_rows(self, chunk_ids: np.ndarray) -> torch.Tensor:
        """The host rows of these chunks' blocks, in order."""
        per = self._blocks_per_chunk
        rows = chunk_ids.astype(np.int64)[:, None] * per + np.arange(per, dtype=np.int64)
        return torch.from_numpy(rows.ravel())


class TorchCopyOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPU offloading spec (scheduler side and LRU manager unchanged)
    with the worker above, on any platform."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = TorchCopyWorker(kv_caches, self.blocks_per_chunk, self.num_chunks)
            logger.info("test host tier (torch copies, synchronous): %d chunks of %d block(s), "
                        "%d bytes a chunk", self.num_chunks, self.blocks_per_chunk,
                        self.kv_bytes_per_chunk)
        return self._worker
