"""The pool counts as contested (`WorkloadModel.contested`, what `ttl_policy:
hazard` charges pinned memory by) from a failed allocation in vLLM's real
scheduler until CONTENTION_WINDOW_S pass without another; each failure is
counted for /metrics."""

from __future__ import annotations

from vllm.v1.request import RequestStatus

from tests.scheduler.harness import make_request, tokens
from vllm_continuum.core.workload import CONTENTION_WINDOW_S


def test_a_failed_allocation_makes_the_pool_contested_for_a_while(build):
    d = build(num_blocks=16, settings={"ttl_policy": "hazard"})
    s = d.scheduler
    workload = s.continuum.workload
    first = d.add(make_request(tokens(1, 150), max_tokens=60))
    d.step()
    assert not workload.contested, "nothing has been refused blocks yet"
    assert s.continuum.stats.block_shortages == 0
    second = d.add(make_request(tokens(2, 150), max_tokens=60))  # 10 blocks; 6 are free
    d.step()
    assert second.status == RequestStatus.WAITING
    assert workload.contested
    assert s.continuum.stats.block_shortages >= 1  # on /metrics: continuum_block_shortages_total
    s.finish_requests([first.request_id, second.request_id], RequestStatus.FINISHED_ABORTED)
    d.advance(CONTENTION_WINDOW_S - 0.5)
    d.step()
    assert workload.contested
    d.advance(1.0)
    d.step()
    assert not workload.contested
