"""Time passes inside one `schedule()` call (scheduler level, both vLLM builds,
sync and async).

vLLM peeks at the waiting queue's head, does that request's prefix lookup,
connector query and `allocate_slots`, and only then pops, assuming the pop
returns the request it peeked. A queue whose order follows the live clock
could pop another request: it enters `running` without blocks while the
peeked one stays queued holding blocks, and the engine core dies at the next
step. Here the clock moves *inside* vLLM's allocation, as a slow connector
lookup or a loaded CPU makes it move on a real server.
"""

from __future__ import annotations

import pytest

from tests.scheduler.harness import FakeClock, audit, drain, make_request, tokens
from vllm_continuum.config import load_config


def _slow_allocations(scheduler, clock: FakeClock, seconds: float, calls: list[int]) -> None:
    """Every allocation vLLM makes advances the clock by `seconds` (only
    while `calls` is non-empty: the test arms it)."""
    stock = scheduler._stock_allocate_slots

    def allocate(request, *args, **kwargs):
        if calls:
            clock.advance(seconds)
            calls.append(1)
        return stock(request, *args, **kwargs)

    scheduler._stock_allocate_slots = allocate


def test_an_overdue_request_never_replaces_the_peeked_head(tiny_model_dir, async_scheduling):
    """The issue's scenario: under `sessionless_first` an agent turn O waits
    after a later request without a session went ahead of it; sessionless S2
    is at the head when, during its allocation, 1.5 s pass and O crosses the
    1 s waiting bound. The pop must still return S2 (and O goes first from
    the next peek on)."""
    from tests.scheduler.harness import Driver, make_scheduler

    config = load_config(use_env=False, queue_order="sessionless_first", max_queue_delay_s=1.0)
    s = make_scheduler(tiny_model_dir, num_blocks=128, async_scheduling=async_scheduling,
                       max_num_batched_tokens=256, continuum_config=config)
    clock = s.continuum.clock = FakeClock()
    driver = Driver(s)
    calls: list[int] = []
    _slow_allocations(s, clock, 1.5, calls)

    agent = driver.add(make_request(tokens(1, 64), session="agent"), [7, 0])
    clock.advance(0.01)
    # S1 fills the step's token budget: it goes ahead of O, whose extra wait begins.
    s1 = driver.add(make_request(tokens(2, 256)), [7, 0])
    out = driver.step()
    assert [n.req_id for n in out.scheduled_new_reqs] == [s1.request_id]
    s2 = driver.add(make_request(tokens(3, 64)), [7, 0])
    assert s.waiting.peek_request() is s2  # sessionless first, O not overdue yet

    calls.append(0)  # arm: the next allocations take 1.5 s each
    out = driver.step()
    audit(s)
    admitted = [n.req_id for n in out.scheduled_new_reqs]
    # S2 was peeked and allocated first, so it is the one admitted first; O,
    # now overdue, is admitted right after it in the same step.
    assert admitted[0] == s2.request_id, admitted
    assert agent.request_id in admitted
    for req_id in admitted:
        assert s.kv_cache_manager.get_block_ids(req_id) != ([],) * len(
            s.kv_cache_config.kv_cache_groups), f"{req_id} admitted without blocks"
    calls.clear()
    drain(driver)
    audit(s)


@pytest.mark.parametrize("queue_order", ["sessionless_first", "program_fcfs"])
def test_order_within_a_step_does_not_follow_the_clock(tiny_model_dir, async_scheduling, queue_order):
    """Within one `schedule()` the queue's order changes only through vLLM's
    own pushes and pops: however long vLLM's calls take, the requests a step
    admits are the queue's order as it stood when the step began."""
    from tests.scheduler.harness import Driver, make_scheduler

    config = load_config(use_env=False, queue_order=queue_order, max_queue_delay_s=0.5)
    s = make_scheduler(tiny_model_dir, num_blocks=256, async_scheduling=async_scheduling,
                       max_num_batched_tokens=128, max_num_seqs=16, continuum_config=config)
    clock = s.continuum.clock = FakeClock()
    driver = Driver(s)
    calls: list[int] = []
    _slow_allocations(s, clock, 0.4, calls)
    # Sessions and one-shots interleaved, each prompt one budget's worth: one
    # admission per step, the rest wait and go overdue while vLLM allocates.
    for i in range(8):
        session = f"s{i}" if i % 2 else None
        driver.add(make_request(tokens(10 + i, 100), session=session), [7, 0])
        clock.advance(0.01)
    calls.append(0)
    for _ in range(40):
        expected = list(s.waiting)  # the order as the step begins
        out = driver.step()
        audit(s)
        admitted = [n.req_id for n in out.scheduled_new_reqs]
        assert admitted == [r.request_id for r in expected[: len(admitted)]], (admitted, expected)
        if not s.has_requests():
            break
    calls.clear()
    drain(driver)
