"""The test host tier (continuum_lab/host_tier.py) and `compare`'s flavours
with it: the worker's copies on real tensors through vLLM's own transfer
specs, the flags vLLM parses and the spec class they name, and where the
flavours' cached tokens are read from. Live: tests/engine/test_engine_offload.py."""

from __future__ import annotations

import json

import pytest
import torch

from continuum_lab.live.flavours import FLAVOURS, STOCK_OFFLOAD, host_tier_setup


def _worker(num_blocks: int, page: int, blocks_per_chunk: int, num_chunks: int):
    from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor

    from continuum_lab.host_tier import TorchCopyWorker

    kv = torch.arange(num_blocks * page, dtype=torch.int32).view(num_blocks, page)
    # Two layers' references to one tensor, the second a shorter (un-padded) page.
    caches = CanonicalKVCaches([CanonicalKVCacheTensor(kv, page * 4)],
                               [[CanonicalKVCacheRef(0, page * 4), CanonicalKVCacheRef(0, page * 2)]])
    return kv, TorchCopyWorker(caches, blocks_per_chunk, num_chunks)


def test_a_store_then_a_load_brings_the_same_bytes_back():
    """Device blocks 5, 6, 7 (a group starting at the request's block 3, mid-chunk
    with 2 blocks a chunk) stored into host chunks 4 and 9; the device blocks
    overwritten; loaded back into blocks 1, 2, 3: the same bytes, and the
    transfer's size is every reference's page of every block."""
    from vllm.v1.kv_offload.base import GPULoadStoreSpec
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    kv, worker = _worker(num_blocks=8, page=16, blocks_per_chunk=2, num_chunks=10)
    original = kv[[5, 6, 7]].clone()
    assert worker.submit_store(1, GPULoadStoreSpec([5, 6, 7], [3], [3]), CPULoadStoreSpec([4, 9]))
    kv.zero_()
    assert worker.submit_load(2, CPULoadStoreSpec([4, 9]), GPULoadStoreSpec([1, 2, 3], [3], [3]))
    assert torch.equal(kv[[1, 2, 3]], original)
    assert kv[[0, 4, 5, 6, 7]].count_nonzero() == 0  # nothing else written
    done = worker.get_finished()
    assert [(r.job_id, r.success, r.transfer_size) for r in done] == [
        (1, True, 3 * (64 + 32)), (2, True, 3 * (64 + 32))]
    assert all(r.transfer_time >= 0 for r in done) and worker.get_finished() == []
    # Block 3 of the request is the second of host chunk 4: row 9 of the host tensor.
    host = worker._host[0].view(-1, 16 * 4).view(torch.int32)
    assert torch.equal(host[9], original[0]) and torch.equal(host[18], original[1])


def test_a_load_copies_each_reference_page_only():
    """A reference's un-padded page bytes are copied, as vLLM's worker does:
    the padding past the longest reference's page stays as it was."""
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor, GPULoadStoreSpec)
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    from continuum_lab.host_tier import TorchCopyWorker

    kv = torch.ones(4, 32, dtype=torch.int8)
    worker = TorchCopyWorker(CanonicalKVCaches([CanonicalKVCacheTensor(kv, 32)],
                                               [[CanonicalKVCacheRef(0, 24)]]), 1, 4)
    worker.submit_load(1, CPULoadStoreSpec([0]), GPULoadStoreSpec([2], [1], [0]))
    assert kv[2, :24].count_nonzero() == 0 and bool((kv[2, 24:] == 1).all())
    assert bool((kv[[0, 1, 3]] == 1).all())


def test_the_flavours_with_a_host_tier_start_with_the_flags_vllm_takes():
    """stock-offload and default-offload are stock and what ships, each with
    vLLM's OffloadingConnector and a host tier of 3x the pool (the benchmark
    model's 64 KiB blocks); vLLM parses the flags, and its offloading factory
    loads the test spec they name (scheduler side and LRU manager: vLLM's)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    from continuum_lab.host_tier import TorchCopyOffloadingSpec

    assert (FLAVOURS[STOCK_OFFLOAD].server, FLAVOURS[STOCK_OFFLOAD].host_tier) == ("stock", True)
    ships = FLAVOURS["default-offload"]
    assert (ships.server, ships.settings, ships.host_tier) == ("continuum", FLAVOURS["default"].settings, True)
    assert FLAVOURS["never-offload"].settings == FLAVOURS["never"].settings
    assert [n for n, f in FLAVOURS.items() if f.host_tier] == [STOCK_OFFLOAD, "default-offload",
                                                               "never-offload"]

    setup = host_tier_setup(["stock", STOCK_OFFLOAD, "default", "default-offload"], 3.0, 750, 2, 32)
    assert (setup["blocks"], setup["flavours"]) == (2250, [STOCK_OFFLOAD, "default-offload"])
    assert host_tier_setup(["stock", "default"], 3.0, 750, 2, 32) == {}
    flag, value = setup["args"]
    extra = json.loads(value)["kv_connector_extra_config"]
    assert flag == "--kv-transfer-config" and extra["cpu_bytes_to_use"] == 2250 * 65536

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    config = parser.parse_args(["--model", "m", *setup["args"]]).kv_transfer_config
    assert (config.kv_connector, config.kv_role) == ("OffloadingConnector", "kv_both")
    spec = OffloadingSpecFactory.get_spec_cls(config.kv_connector_extra_config)
    assert spec is TorchCopyOffloadingSpec and issubclass(spec, CPUOffloadingSpec)
    assert spec.get_manager is CPUOffloadingSpec.get_manager


def test_cache_counters_from_a_known_exposition(monkeypatch):
    """Where a replay's prompt tokens came from, by vLLM's own counters, and what
    the host tier moved; the difference of two reads is the replay's."""
    import httpx

    from continuum_lab.live.server_counters import cache_counters, cache_line, counter_delta

    def page(computed, gpu, host, load_bytes, load_s, store_bytes):
        return "\n".join([
            "# TYPE vllm:prompt_tokens_by_source counter",
            f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="local_compute"}} {computed}',
            f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="local_cache_hit"}} {gpu}',
            f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="external_kv_transfer"}} {host}',
            "# TYPE vllm:kv_offload_load_bytes counter",
            f'vllm:kv_offload_load_bytes_total{{engine="0",model_name="m"}} {load_bytes}',
            "# TYPE vllm:kv_offload_load_time counter",
            f'vllm:kv_offload_load_time_total{{engine="0",model_name="m"}} {load_s}',
            "# TYPE vllm:kv_offload_store_bytes counter",
            f'vllm:kv_offload_store_bytes_total{{engine="0",model_name="m"}} {store_bytes}',
            "# TYPE vllm:external_prefix_cache_hits counter",
            f'vllm:external_prefix_cache_hits_total{{engine="0",model_name="m"}} {host}',
            f'vllm:external_prefix_cache_hits_created{{engine="0",model_name="m"}} 1.7e9',
            "",
        ])

    pages = {"http://a/metrics": page(100, 0, 0, 0, 0.0, 0),
             "http://b/metrics": page(400, 300, 300, 2097152, 0.5, 3145728)}
    monkeypatch.setattr(httpx, "get", lambda url, timeout: httpx.Response(
        200, text=pages[url], request=httpx.Request("GET", url)))
    before, after = cache_counters("http://a"), cache_counters("http://b")
    assert after == {"computed": 400, "gpu_cache": 300, "host_tier": 300, "load_bytes": 2097152,
                     "load_s": 0.5, "store_bytes": 3145728, "store_s": 0, "prefix_cache_hits": 0,
                     "external_prefix_cache_hits": 300}
    delta = counter_delta(before, after)
    assert (delta["computed"], delta["host_tier"], delta["load_bytes"]) == (300, 300, 2097152)
    assert cache_line("x", delta) == (
        "x: prompt tokens 900: computed 300 (33.3%), GPU prefix cache (pins included) 300 (33.3%), "
        "host tier 300 (33.3%); host tier loaded 2 MiB in 0.50 s, stored 3 MiB in 0.00 s")
    stock = counter_delta(before, before)
    assert "host tier loaded" not in cache_line("stock", stock)


@pytest.mark.parametrize("baseline", ["stock", STOCK_OFFLOAD])
def test_rounds_are_set_against_either_baseline(baseline):
    """compare's round table and outcomes against stock, and against stock + offload."""
    from continuum_lab.live.round_report import round_outcomes, round_table
    from tests.unit.test_bench import _run

    rounds = [[_run("stock", 10.0, 32), _run(STOCK_OFFLOAD, 8.0, 100), _run("default-offload", 4.0, 110)]]
    lines = round_table(rounds, baseline).splitlines()
    assert f"| {baseline} / mean JCT |" in lines[0]
    base = 10.0 if baseline == "stock" else 8.0
    (row,) = [r for r in lines if "| default-offload |" in r]
    assert f"| 4.00 | {base / 4:.2f}x |" in row
    assert f"default-offload: {baseline} / mean JCT by round {base / 4:.2f}x" in "\n".join(lines)
    assert round_outcomes(rounds, baseline).startswith(f"Round 1. Outcome against {baseline}")
