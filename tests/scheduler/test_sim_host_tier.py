"""The simulator's host tier (lab/continuum_lab/sim/host_tier.py): vLLM's own
`OffloadingConnector` scheduler side, CPU spec and LRU manager, with a
worker that copies in simulated time.

- on a scripted trace, an agent's prompt evicted from the GPU by another
  program's comes back from the host tier: the blocks vLLM's GPU prefix
  cache lost are loaded (the request waits for the copy's modelled time),
  the rest found on the GPU, outputs recomputed unless stored
  (`offload_prompt_only`), nothing reloaded once the host LRU evicted it;
  and the connector ends with no job or request state left;
- the worker alone, on vLLM's job metadata: stores go one step late, loads
  are submitted after the step that scheduled them and reported at the first
  step end after their copy, each direction a FIFO, flushes held before the
  forward, and copies slow the steps they overlap.
"""

from __future__ import annotations

import pytest

from continuum_lab.sim.cost_model import CostModel, Roofline
from continuum_lab.sim.host_tier import BANDWIDTH, INTERFERENCE, HostTier, OffloadWorker
from continuum_lab.sim.loop import Simulation
from continuum_lab.sim.policies import split_offload
from continuum_lab.trace_format import Program, Trace, Turn

# A 64-block pool on the H100 roofline (2 MiB of KV a block).
TINY = CostModel(
    name="tiny-roofline", kind="roofline", block_size=16, num_gpu_blocks=65, max_num_seqs=8,
    max_num_batched_tokens=512, max_model_len=4096,
    roofline=Roofline(flops_per_token=1.606e10, attn_flops_per_pair=524288, weight_bytes=1.606e10,
                      kv_bytes_per_token=131072, peak_flops=9.89e14, mfu=0.45,
                      peak_bandwidth=3.35e12, bandwidth_efficiency=0.8, overhead_s=0.002))


def _trace(output_tokens: int = 1) -> Trace:
    """Agent A's 20-block prompt, a 5 s tool, then its next turn; program B's
    900-token prompt meanwhile evicts A's later blocks from the GPU."""
    return Trace([Program("A", 0.0, (Turn(320, output_tokens, "t", 5.0), Turn(16, 1))),
                  Program("B", 1.0, (Turn(900, 1),))])


def _run(policy: str, output_tokens: int = 1):
    sim = Simulation(_trace(output_tokens), TINY, policy)
    run = sim.run()
    return sim, run, next(t for t in run.turns if (t.program, t.turn) == ("A", 1))


def test_an_evicted_prompt_comes_back_from_the_host_tier():
    _, stock, lost = _run("stock")
    sim, run, back = _run("stock+offload-3x")
    gpu = stock.meta["resume_tokens"]["gpu"]
    assert 0 < lost.cached_tokens == gpu < 320, "stock keeps only the prompt's first blocks"
    assert back.cached_tokens == 320  # every full block of the prompt: the GPU's, then the host's
    assert run.meta["resume_tokens"] == {"gpu": gpu, "host_tier": 320 - gpu, "computed": 17}
    tier = run.meta["host_tier"]
    assert tier["blocks"]["load"] == (320 - gpu) // 16
    # Nothing else ran: the turn waited exactly for its copy, in WAITING_FOR_REMOTE_KVS.
    copy_s = (320 - gpu) * 131072 / BANDWIDTH["pcie5"]
    assert sim.admission_waits[("A", 1)] == pytest.approx(copy_s)
    connector = sim.scheduler.connector.scheduler
    assert not connector._jobs and not connector._req_status, "the connector drained"


def test_outputs_come_back_only_when_stored():
    _, _, prompt_only = _run("stock+offload-3x", output_tokens=32)
    _, _, outputs = _run("stock+offload-3x-outputs", output_tokens=32)
    assert prompt_only.cached_tokens == 320  # offload_prompt_only (vLLM's default)
    assert outputs.cached_tokens == 336  # prompt + output, up to the last committed token's block


def test_the_host_lru_evicts_at_its_capacity():
    _, stock, _ = _run("stock")
    _, run, back = _run("stock+offload-0.5x")  # 32 host blocks: B's prompt evicts A's
    assert run.meta["resume_tokens"]["host_tier"] == 0
    assert back.cached_tokens == stock.meta["resume_tokens"]["gpu"]


def test_offload_labels():
    assert split_offload("default") == ("default", None)
    assert split_offload("stock+offload") == ("stock", HostTier())
    name, tier = split_offload("oracle-program+offload-3x-pcie4-contended-outputs")
    assert name == "oracle-program" and tier == HostTier(3.0, "pcie4", "contended", False)
    assert HostTier.parse(tier.label) == tier
    with pytest.raises(ValueError, match="pcie9"):
        HostTier.parse("pcie9")


# --- the worker alone, on vLLM's own job metadata ---------------------------
def _meta(loads=(), stores=(), flush=()):
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingConnectorMetadata,
        TransferJob,
    )
    from vllm.v1.kv_offload.base import GPULoadStoreSpec

    def spec(n):
        return GPULoadStoreSpec(list(range(1, n + 1)), group_sizes=[n], block_indices=[0])

    return OffloadingConnectorMetadata(
        load_jobs={j: TransferJob(req, None, spec(n)) for j, req, n in loads},
        store_jobs={j: TransferJob("s", spec(n), None) for j, n in stores},
        jobs_to_flush=set(flush))


BLOCK = 1e9  # bytes a block: one block is 20 ms over PCIe 5 (50 GB/s)


def _completed(out) -> set[int]:
    meta = out.kv_connector_worker_meta
    return set(meta.completed_jobs) if meta is not None else set()


def test_worker_stores_one_step_late_loads_after_the_forward():
    w = OffloadWorker(HostTier(), BLOCK, 16)
    assert w.start(_meta(), 0.0) == 0.0
    out = w.finish(_meta(loads=[(1, "r", 2)], stores=[(2, 1)]), 0.010)
    assert not _completed(out) and out.finished_recving is None
    # The load went at the step's end (10 ms), 40 ms; the store waits for the next step.
    assert w.next_done() == pytest.approx(0.050)
    assert w.start(_meta(), 0.010) == 0.010  # step 2: the store goes now, 20 ms
    out = w.finish(_meta(), 0.035)
    assert _completed(out) == {2} and out.finished_recving is None
    out = w.finish(_meta(), 0.060)
    assert _completed(out) == {1} and out.finished_recving == {"r"}
    stats = out.kv_connector_worker_meta.transfer_stats
    assert (stats.load.bytes, stats.load.time) == (2 * BLOCK, pytest.approx(0.040))


def test_worker_copies_in_order_within_a_direction_and_holds_a_flush():
    w = OffloadWorker(HostTier(bus="pcie4"), BLOCK, 16)  # 40 ms a block
    w.start(_meta(), 0.0)
    w.finish(_meta(loads=[(1, "a", 1), (2, "b", 1)], stores=[(3, 1), (4, 1)]), 0.0)
    # Both stores go at the next step's start; the step waits for the one to flush.
    assert w.start(_meta(flush=[4]), 0.0) == pytest.approx(0.080)
    assert _completed(w.finish(_meta(), 0.079)) == {1, 3}
    assert _completed(w.finish(_meta(), 0.080)) == {2, 4}


def test_copies_slow_the_steps_they_overlap():
    w = OffloadWorker(HostTier(interference="contended"), BLOCK, 16)
    rates = INTERFERENCE["contended"]
    w.finish(_meta(loads=[(1, "a", 1)]), 0.0)  # loading until 20 ms
    assert w.extra_step_s(0.0, 0.010) == pytest.approx(rates.load * 0.010)
    assert w.extra_step_s(0.010, 0.030) == pytest.approx(rates.load * 0.010)
    assert w.extra_step_s(0.030, 0.010) == 0.0
