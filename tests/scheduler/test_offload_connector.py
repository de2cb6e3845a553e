"""Pins beside vLLM's KV offload to host memory (scheduler level, both vLLM
builds, sync and async): the real `OffloadingConnector` scheduler side, its
CPU spec and LRU manager, with a scripted worker (offload_worker.py). The
block audit runs at every step; every test ends with the run drained and
the connector holding no job and no request state.

- a pinned turn finds its context on the GPU: no load;
- a pin that expired, its blocks evicted by other traffic, is not lost: the
  next turn loads them from the host tier (waiting in vLLM's
  `WAITING_FOR_REMOTE_KVS`) and runs with them;
- a pin released under pressure while its blocks' stores are still in
  flight: vLLM's fence makes the worker flush them before the blocks are
  written again;
- under async scheduling, a pin younger than vLLM's fence gives its blocks
  back through the deferred-free queue, with the connector on;
- `reset_prefix_cache(reset_connector=True)` with pins and stores pending:
  pins released, the host tier emptied, the stale completions ignored, the
  next turn computes its context again;
- under hold, a pin the host tier would serve back gives way to a waiting
  request once lost pins have been coming back from the cache, and only then
  (core/reloadable.py).

And what the pin rules read of the connector (adapter/host_tier.py): what
the host tier holds of a pinned context (its prompt's blocks: outputs are
not stored), the price of losing it, where each resumed turn's context came
from (pinned, host_tier, gpu_cache, recomputed), how fast the tier loads.
"""

from __future__ import annotations

import pytest
from vllm.v1.request import RequestStatus

from tests.scheduler.harness import (
    FakeClock,
    admitted_hit,
    answer_script,
    audit,
    make_request,
    make_scheduler,
    next_turn,
    tokens,
    tool_call_script,
)
from tests.scheduler.kv_connector import ConnectorDriver
from tests.scheduler.offload_worker import (
    HOST_BLOCKS,
    ScriptedOffloadWorker,
    connector_state,
    offload_transfer_config,
)
from vllm_continuum.adapter.host_tier import (
    DEFAULT_LOAD_BYTES_PER_S,
    MIN_MEASURED_BYTES,
    ConnectorHostTier,
)
from vllm_continuum.config import load_config
from vllm_continuum.core.pin_table import ReleaseReason
from vllm_continuum.core.reloadable import MIN_SAMPLES

PROMPT = 100  # tokens: 6 full blocks of 16, what the host tier stores of the turn


def _build(model_dir, async_scheduling, num_blocks=96, hold=(), host_blocks=HOST_BLOCKS,
           **settings) -> ConnectorDriver:
    settings = {"ttl_policy": "fixed", "default_ttl_s": 2.0, "max_session_pinned_fraction": 1.0,
                **settings}
    config = load_config(use_env=False, **settings)
    s = make_scheduler(model_dir, num_blocks=num_blocks, async_scheduling=async_scheduling,
                       kv_transfer_config=offload_transfer_config(host_blocks),
                       continuum_config=config)
    s.continuum.clock = FakeClock()
    assert type(s.connector).__name__ == "OffloadingConnector"
    return ConnectorDriver(s, worker=ScriptedOffloadWorker(hold=set(hold)))


def _first_turn(d: ConnectorDriver, session="A"):
    t1 = d.add(make_request(tokens(1, PROMPT), session=session, max_tokens=16),
               tool_call_script(d, "search"))
    d.until(t1.is_finished)
    d.flush()
    return t1


def _drain(d: ConnectorDriver) -> None:
    """Step until nothing is left, vLLM's connector included (`has_requests`
    keeps the engine stepping while it has jobs in flight)."""
    s = d.scheduler
    d.until(lambda: not s.has_requests() and not d.worker.busy, max_steps=200)
    d.flush()
    assert connector_state(s) == (0, 0)
    s.continuum.releaser.release_all(ReleaseReason.RESET)
    counts = audit(s)
    assert counts["free"] == counts["pool"], counts


def test_a_pinned_turn_hits_on_the_gpu_without_a_load(tiny_model_dir, async_scheduling):
    d = _build(tiny_model_dir, async_scheduling)
    s = d.scheduler
    t1 = _first_turn(d)
    pin = s.continuum.pins.get("A")
    assert d.worker.stored_blocks >= PROMPT // 16  # the prompt went to the host tier meanwhile
    # What losing the pin would cost: a reload of the prompt's blocks (its
    # output is not stored: offload_prompt_only), at the default rate until measured.
    tier = s._host_tier
    assert pin.held.tokens == (PROMPT // 16) * 16 < pin.context_tokens
    assert pin.held.reload_s == pytest.approx(pin.held.tokens * tier.bytes_per_token / DEFAULT_LOAD_BYTES_PER_S)
    t2 = d.add(next_turn(t1, extra=60), answer_script())
    hit = admitted_hit(d, t2)
    assert hit == (t1.num_computed_tokens // 16) * 16  # the whole history: prompt and output
    assert d.worker.loads == {}
    assert s.continuum.stats.releases_by_reason == {"resumed": 1}
    assert s.continuum.stats.resume_sources == {"pinned": 1}
    assert s.continuum.stats.pin_reload_saved_s == pytest.approx(pin.held.reload_s)
    d.until(t2.is_finished)
    _drain(d)


def test_an_expired_pins_next_turn_loads_from_the_host_tier(tiny_model_dir, async_scheduling):
    d = _build(tiny_model_dir, async_scheduling, num_blocks=64, hold={"load"})
    s, clock = d.scheduler, d.scheduler.continuum.clock
    t1 = _first_turn(d)
    clock.advance(5.0)  # past the 2 s TTL
    filler = d.add(make_request(tokens(3000, 60 * 16), max_tokens=2))  # evicts A's blocks
    d.until(filler.is_finished)
    d.flush()
    assert s.continuum.stats.releases_by_reason == {"expired": 1}
    t2 = d.add(next_turn(t1, extra=40), answer_script())
    d.until(lambda: t2.request_id in d.worker.loads)
    d.step()
    assert t2.status == RequestStatus.WAITING_FOR_REMOTE_KVS  # held until the copy is done
    loaded = d.worker.loads[t2.request_id] * 16
    d.worker.release("load")
    hit = admitted_hit(d, t2)
    assert hit == (PROMPT // 16) * 16 and 0 < loaded <= hit  # the GPU's blocks, then the host's
    d.until(t2.is_finished)
    assert s.continuum.stats.releases_by_reason == {"expired": 1}
    assert s.continuum.stats.resume_sources == {"host_tier": 1}
    _drain(d)


def test_a_pressure_release_with_stores_in_flight_is_flushed(tiny_model_dir, async_scheduling):
    d = _build(tiny_model_dir, async_scheduling, num_blocks=24, hold={"store"})
    s = d.scheduler
    _first_turn(d)  # 7 blocks pinned, its stores still in flight
    stores = set(d.worker.pending)
    assert stores
    grower = d.add(make_request(tokens(2000, 150), max_tokens=180))  # grows to 21 blocks
    d.until(grower.is_finished, max_steps=300)
    assert grower.num_preemptions == 0
    assert s.continuum.stats.releases_by_reason == {"pressure": 1}
    assert d.worker.flushed and d.worker.flushed <= stores  # the pin's stores, before reuse
    d.worker.release("store")
    _drain(d)


def test_a_young_pin_is_freed_behind_vllms_fence_with_the_offload_connector(tiny_model_dir):
    d = _build(tiny_model_dir, async_scheduling=True, max_ttl_s=30.0)
    s = d.scheduler
    assert s.defer_block_free  # kv_both is a consumer: vLLM defers frees under async scheduling
    t1 = d.add(make_request(tokens(1, PROMPT), session="A", max_tokens=16),
               tool_call_script(d, "search"))
    d.until(lambda: s.continuum.pins.get("A") is not None)
    pin = s.continuum.pins.get("A")
    assert t1.is_finished() and pin.fence > s.processed_step_seq, "the pin is not young"
    s.reset_prefix_cache()
    assert not s.continuum.pins.holds(pin)
    assert [fence for fence, blocks in s.deferred_frees
            if {b.block_id for b in blocks} == set(pin.block_ids)] == [pin.fence]
    _drain(d)


def test_reset_prefix_cache_with_the_connector_and_stores_in_flight(tiny_model_dir, async_scheduling):
    d = _build(tiny_model_dir, async_scheduling, hold={"store"})
    s = d.scheduler
    t1 = _first_turn(d)
    d.until(lambda: not s.deferred_frees)
    assert d.worker.pending and connector_state(s)[0] > 0
    assert s.reset_prefix_cache(reset_connector=True) is True
    assert s.continuum.stats.releases_by_reason == {"reset": 1}
    assert connector_state(s)[0] == 0  # its jobs forgotten; their late completions are ignored
    d.worker.release("store")
    d.step()
    t2 = d.add(next_turn(t1, extra=40), answer_script())
    assert admitted_hit(d, t2) == 0  # neither the GPU nor the host tier kept anything
    assert d.worker.loads == {}
    assert s.continuum.stats.resume_sources == {"recomputed": 1}
    d.until(t2.is_finished)
    _drain(d)


def test_the_host_tier_loads_at_the_rate_its_worker_measured(tiny_model_dir):
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingWorkerMetadata,
    )
    from vllm.v1.outputs import KVConnectorOutput

    s = _build(tiny_model_dir, async_scheduling=False).scheduler
    tier = s._host_tier
    assert isinstance(tier, ConnectorHostTier) and tier.load_bytes_per_s == DEFAULT_LOAD_BYTES_PER_S

    def loads(num_bytes: int, seconds: float) -> KVConnectorOutput:
        meta = OffloadingWorkerMetadata()
        meta.transfer_stats.load.record(num_bytes, seconds)
        meta.transfer_stats.store.record(10 * num_bytes, seconds)  # stores do not count
        meta.mark_completed(0)
        return KVConnectorOutput(kv_connector_worker_meta=meta)

    tier.observe(loads(MIN_MEASURED_BYTES // 2, 1e-3))
    assert tier.load_bytes_per_s == DEFAULT_LOAD_BYTES_PER_S  # too little to go by
    tier.observe(loads(MIN_MEASURED_BYTES, 1e-3))
    assert tier.load_bytes_per_s == pytest.approx(1.5 * MIN_MEASURED_BYTES / 2e-3)
    assert ConnectorHostTier.of(make_scheduler(tiny_model_dir, num_blocks=32)) is None  # no connector


def test_an_expired_pins_host_copy_is_kept_before_its_blocks_become_evictable(tiny_model_dir):
    """The host tier (14 blocks) holds two contexts' prompts, A's the older;
    A's pin expires, and with it its GPU blocks become evictable: its host copy
    is touched, so the next store evicts B's prompt, not A's, and A's next
    turn loads all of it once other traffic has taken its GPU blocks."""
    d = _build(tiny_model_dir, async_scheduling=False, num_blocks=64, host_blocks=14)
    s = d.scheduler
    t1 = _first_turn(d, "A")
    b = d.add(make_request(tokens(700, PROMPT), session="B", max_tokens=2))
    d.until(b.is_finished)
    d.step()  # the connector hears B finished: its prompt is the host's most recent
    s.continuum.clock.advance(5.0)
    d.step()  # A's pin expires: its host copy becomes the most recent
    assert s.continuum.stats.releases_by_reason == {"expired": 1}
    for start, n in ((3000, 60 * 16), (5000, PROMPT)):  # the GPU's blocks taken; a store evicts
        other = d.add(make_request(tokens(start, n), max_tokens=2))
        d.until(other.is_finished)
    t2 = d.add(next_turn(t1, extra=40), answer_script())
    assert admitted_hit(d, t2) == (PROMPT // 16) * 16
    assert d.worker.loads[t2.request_id] == PROMPT // 16  # all of it from the host tier
    d.until(t2.is_finished)
    _drain(d)


def _lost_pins_come_back(d: ConnectorDriver, n: int, salt: str | None = None,
                         pinned: bool = False) -> None:
    """`n` programs (of tenant `salt`) come back a moment later. Their tool
    (`quick`, TTL 0) is never pinned: their next turns find their contexts
    cached; or (`pinned`) it is, and the pins are handed to their next turns
    while the host tier still holds the contexts. Either is what the
    reloadable rule measures (nothing here tells it so). Pinned contexts are
    4x longer: the host holds prompts, not the outputs on top of them."""
    for i in range(n):
        t1 = d.add(make_request(tokens(100 + i, PROMPT * (4 if pinned else 1)), session=f"w{i}",
                                max_tokens=16, cache_salt=salt),
                   tool_call_script(d, "search" if pinned else "quick"))
        d.until(t1.is_finished)
        d.flush()
        t2 = d.add(next_turn(t1, extra=4, cache_salt=salt), answer_script())
        d.until(t2.is_finished)
        d.flush()


@pytest.mark.parametrize("served, rule, gives_way", [
    ("A's", True, True),  # its tenant's lost pins came back from the cache: a reload away
    ("A's pinned", True, True),  # its tenant's pins were resumed while the host held them too
    ("A's pinned, tier small", True, False),  # ... but the host held only part of them: kept
    ("too few", True, False),  # too few to go by: kept, as the paper's hold keeps it
    ("another tenant's", True, False),  # only another tenant's came back: kept
    ("A's", False, False),  # `reloadable_pins_yield: false`: kept
])
def test_a_reloadable_pin_gives_way_while_the_host_tier_serves_lost_pins_back(
        tiny_model_dir, async_scheduling, served, rule, gives_way):
    """Pool of 63 blocks. A's pin holds 7 (TTL 100 s), a long one-shot runs
    on 21 and grows; a one-shot of 38 blocks arrives: 35 are free. Under
    hold a pin is kept while other work runs, so it waits for the runner; a
    pin whose loss costs a reload gives way at once when the tier has been
    serving its tenant's lost pins back, or holding its resumed pins'
    contexts (another tenant's, a `cache_salt`, count for that tenant only),
    and A's next turn then finds its context cached."""
    small = served.endswith("tier small")  # 16 blocks: A's prompt (6), not the pinned ones' (25)
    d = _build(tiny_model_dir, async_scheduling, num_blocks=64, default_ttl_s=100.0,
               tool_ttl_s={"quick": 0}, reloadable_pins_yield=rule, host_blocks=16 if small else HOST_BLOCKS)
    s = d.scheduler
    _lost_pins_come_back(d, MIN_SAMPLES // 2 if served == "too few" else MIN_SAMPLES,
                         salt="other" if served == "another tenant's" else None,
                         pinned=served.startswith("A's pinned"))
    assert (s.continuum.reloadable is not None) == rule
    if served.startswith("A's pinned"):  # the evidence is the pins' hand-overs
        assert s.continuum.reloadable.served(None).trusted != small
    t1 = _first_turn(d, "A")
    pin = s.continuum.pins.get("A")
    assert pin is not None and pin.reloadable == gives_way
    assert s.continuum.stats.reloadable_pins == gives_way  # continuum_reloadable_pins_total
    runner = d.add(make_request(tokens(900, 20 * 16), max_tokens=150))
    d.until(lambda: runner.status == RequestStatus.RUNNING)
    late = d.add(make_request(tokens(901, 38 * 16), max_tokens=2))
    d.step()
    d.flush()
    assert (late.status != RequestStatus.WAITING) == gives_way
    assert s.continuum.pins.holds(pin) != gives_way
    if gives_way:
        assert s.continuum.stats.releases_by_reason.get("pressure") == 1
        t2 = d.add(next_turn(t1, extra=8), answer_script())
        assert admitted_hit(d, t2) >= (PROMPT // 16) * 16  # a reload (or the GPU's LRU), no prefill
        assert s.continuum.stats.resume_sources.get("recomputed", 0) == 0
        d.until(t2.is_finished)
    else:
        d.until(late.is_finished, max_steps=300)  # it waited for the runner, pin kept
        assert runner.is_finished() and s.continuum.stats.releases_by_reason.get("pressure") is None
    _drain(d)
