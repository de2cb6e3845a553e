"""Pins beside a KV connector (scheduler level, both vLLM builds), with the
scripted connector of `kv_connector.py`:

- an async KV load: the next turn waits in vLLM's own holding queue, which
  our waiting queue never sees; its pin is handed over when vLLM allocates
  for it (the allocation touched the pinned blocks), not left to expire;
- a connector that frees late (it sends the blocks first): the turn ends when
  it finishes, not when its blocks come back, so the tool's duration is
  measured from the real end, and no pin is made for a context whose next
  turn already holds it;
- deferred frees (a KV-consumer connector with async scheduling): a pin
  younger than vLLM's fence gives its blocks back through the deferred-free
  queue, as stock frees a finished request's, never early.

Async scheduling is driven as vLLM's engine core runs it: step N+1 is
scheduled before step N's output is processed.
"""

from __future__ import annotations

from tests.scheduler.harness import (
    FakeClock,
    answer_script,
    audit,
    make_request,
    make_scheduler,
    next_turn,
    tokens,
    tool_call_script,
)
from tests.scheduler.kv_connector import ConnectorDriver, kv_transfer_config
from vllm_continuum.config import load_config


def _build(model_dir, async_scheduling, num_blocks=96, **settings):
    config = load_config(use_env=False, ttl_policy="fixed", default_ttl_s=2.0,
                         max_session_pinned_fraction=1.0, **settings)
    s = make_scheduler(model_dir, num_blocks=num_blocks, async_scheduling=async_scheduling,
                       kv_transfer_config=kv_transfer_config(), continuum_config=config)
    s.continuum.clock = FakeClock()
    assert s.connector is not None
    return ConnectorDriver(s)


def _first_turn(d: ConnectorDriver, session="A"):
    t1 = d.add(make_request(tokens(1, 100), session=session, max_tokens=16),
               tool_call_script(d, "search"))
    d.until(t1.is_finished)
    d.flush()
    return t1


def test_a_turn_that_loads_kv_async_takes_its_pin_over(tiny_model_dir, async_scheduling):
    d = _build(tiny_model_dir, async_scheduling)
    s, clock = d.scheduler, d.scheduler.continuum.clock
    t1 = _first_turn(d)
    pin = s.continuum.pins.get("A")
    assert pin is not None
    t2 = next_turn(t1, extra=60)
    s.connector.external[t2.request_id] = (32, True)  # two more blocks, loaded async
    d.add(t2, answer_script())
    d.until(lambda: t2.request_id in s.connector.loads)
    d.step()
    assert not s.continuum.pins.holds(pin)  # handed over at allocation
    clock.advance(5.0)  # the load outlasts the pin's TTL
    for _ in range(3):
        d.step()
    d.recv_done.add(t2.request_id)
    d.until(t2.is_finished)
    d.flush()
    assert s.continuum.stats.releases_by_reason == {"resumed": 1}
    assert not s.requests


def test_a_connector_that_frees_late_ends_the_turn_when_it_finishes(tiny_model_dir, async_scheduling):
    d = _build(tiny_model_dir, async_scheduling)
    s, clock = d.scheduler, d.scheduler.continuum.clock
    t1 = make_request(tokens(1, 100), session="A", max_tokens=16)
    s.connector.delay_free.add(t1.request_id)  # the connector sends the blocks first
    d.add(t1, tool_call_script(d, "search"))
    d.until(t1.is_finished)
    d.flush()
    assert t1.request_id in s.requests  # finished, blocks still held for the connector
    clock.advance(0.5)  # the tool runs
    t2 = d.add(next_turn(t1, extra=40), answer_script())
    assert s.continuum.workload.tools.of(None).durations.of("search").sorted == [0.5]
    d.until(lambda: t2.num_computed_tokens > 0)  # admitted, its prefix found cached
    d.send_done.add(t1.request_id)  # now the connector gives the blocks back
    d.until(t2.is_finished)
    d.flush()
    # No pin for a context its next turn already holds (it would only expire).
    assert not s.continuum.pins and s.continuum.stats.releases_by_reason == {}
    assert not s.requests
    audit(s)


def test_a_young_pin_gives_its_blocks_back_through_the_deferred_free_queue(tiny_model_dir):
    """With a KV-consumer connector and async scheduling vLLM defers frees; a
    pin taken while the turn's last step may still be in flight carries that
    fence, and releasing it before the fence passes queues its blocks exactly
    as stock queues a finished request's."""
    d = _build(tiny_model_dir, async_scheduling=True, max_ttl_s=30.0)
    s = d.scheduler
    assert s.defer_block_free
    t1 = d.add(make_request(tokens(1, 100), session="A", max_tokens=16),
               tool_call_script(d, "search"))
    d.until(lambda: s.continuum.pins.get("A") is not None)  # the output is processed, a step in flight
    pin = s.continuum.pins.get("A")
    assert t1.is_finished() and pin.fence > s.processed_step_seq, "the pin is not young"
    s.reset_prefix_cache()  # any release before the fence: here a reset
    assert not s.continuum.pins.holds(pin)
    fences = [fence for fence, blocks in s.deferred_frees
              if {b.block_id for b in blocks} == set(pin.block_ids)]
    assert fences == [pin.fence]
    free = {b.block_id for b in s.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()}
    assert not free & set(pin.block_ids), "handed back before the fence"
    audit(s)
    d.step()
    d.flush()
    assert not s.deferred_frees
    audit(s)
