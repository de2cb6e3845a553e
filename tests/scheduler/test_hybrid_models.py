"""Models with several KV cache groups (here a full-attention group and a
sliding-window one sharing the pool), scheduler level, both vLLM builds.

Stock vLLM frees a finished request group by group, each group's blocks in
reverse (tail first): that order is the LRU eviction order of the prefix
cache. `ttl_policy: never` + `queue_order: fcfs` must be stock exactly, so
it takes nothing from a finished request; and a pin that ends gives its
blocks back in stock's order, so eviction afterwards is what stock's would
have been.
"""

from __future__ import annotations

from tests.scheduler.harness import (
    Driver,
    FakeClock,
    audit,
    drain,
    make_request,
    make_scheduler,
    tokens,
    tool_call_script,
)
from vllm_continuum.config import load_config

WINDOW = 48  # tokens: prompts of 100-300 tokens leave null blocks in the window's group


def _hybrid(model_dir, async_scheduling, **settings):
    continuum = settings.pop("continuum", True)
    extra = {"continuum_config": load_config(use_env=False, **settings)} if continuum else {}
    s = make_scheduler(model_dir, num_blocks=96, async_scheduling=async_scheduling,
                       continuum=continuum, sliding_window=WINDOW, **extra)
    assert len(s.kv_cache_config.kv_cache_groups) == 2
    if continuum:
        s.continuum.clock = FakeClock()
    return Driver(s)


def _pool_state(s):
    pool = s.kv_cache_manager.block_pool
    free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    refs = [b.ref_cnt for b in pool.blocks if not b.is_null]
    return free, refs


def test_never_with_fcfs_frees_exactly_as_stock(tiny_model_dir, async_scheduling):
    """Agent sessions whose turns end in tool calls, and churn: the free
    queue (eviction order) and every reference count match stock vLLM's
    after every step."""
    runs = {}
    for flavour in ("stock", "never-fcfs"):
        settings = ({"continuum": False} if flavour == "stock"
                    else {"ttl_policy": "never", "queue_order": "fcfs"})
        d = _hybrid(tiny_model_dir, async_scheduling, **settings)
        states = []
        history = {f"s{i}": tokens(i, 100 + 40 * i) for i in range(3)}
        for turn in range(3):
            for i, session in enumerate(history):
                request = make_request(history[session] + tokens(100 * turn + i, 20),
                                       session=session, max_tokens=16)
                d.add(request, tool_call_script(d, "search"))
            d.add(make_request(tokens(5000 + turn, 200), max_tokens=4))
            for _ in range(60):
                d.step()
                audit(d.scheduler)
                states.append(_pool_state(d.scheduler))
                if not d.scheduler.has_requests():
                    break
            assert not d.scheduler.has_requests()
        runs[flavour] = states
    assert len(runs["stock"]) > 20
    assert runs["never-fcfs"] == runs["stock"]


def test_a_pin_gives_its_blocks_back_in_stocks_order(tiny_model_dir, async_scheduling):
    """One tool-call turn: stock frees it at once; continuum pins it and lets
    it expire. Afterwards the two pools are the same, free queue included."""
    pools = {}
    for flavour in ("stock", "fixed"):
        settings = ({"continuum": False} if flavour == "stock"
                    else {"ttl_policy": "fixed", "default_ttl_s": 2.0,
                          "max_session_pinned_fraction": 1.0})
        d = _hybrid(tiny_model_dir, async_scheduling, **settings)
        request = d.add(make_request(tokens(1, 250), session="A", max_tokens=16),
                        tool_call_script(d, "search"))
        d.run_until_finished(request)
        s = d.scheduler
        if flavour == "fixed":
            assert s.continuum.pins.get("A") is not None
            s.continuum.clock.advance(3.0)
            drain(d) if s.has_requests() else d.step()  # an idle step: the TTL passes
            assert s.continuum.stats.releases_by_reason == {"expired": 1}
        audit(s)
        pools[flavour] = _pool_state(s)
    assert pools["fixed"] == pools["stock"]
