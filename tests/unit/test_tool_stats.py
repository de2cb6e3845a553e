"""Tool statistics kept per tenant (core/tool_stats.py): a tenant's calls never
enter another's decisions; salted tenants are bounded, and a forgotten one
decides as a cold start (holds), never shorter."""

from __future__ import annotations

import pytest

from vllm_continuum.core.hazard_ttl import HazardTTLPolicy
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.tool_stats import MAX_TENANTS, TOOLS_PER_TENANT, ToolStats
from vllm_continuum.core.ttl import TurnEnd
from vllm_continuum.core.workload import WorkloadModel


def rule(revisit_s: float = 1e9) -> HazardTTLPolicy:
    workload = WorkloadModel(history_limit=1000, queueing_window=16, program_window=16)
    workload.blocks_short(0.0)  # contested: memory has a price
    workload.tools.track_running_calls(30.5, forget_after_s=600.0, max_calls=10_000)
    return HazardTTLPolicy(workload, PrefillProfile(c0=0.5, c1=0.0, c2=0.0), 30.0, revisit_s=revisit_s)


def test_another_tenants_calls_never_enter_a_decision():
    """Tenant A's Bash returns in under a second; 1,000 calls of "Bash" by
    another tenant (or by requests without a salt) outlast the cap and never
    return: A's Bash pin is held as before. The same calls within A's own
    tenant do switch it off (calls are pooled within a tenant)."""
    p = rule()
    for d in (0.2, 0.4, 0.8) * 5:
        p.workload.tool_returned("tenant-a", "a", "Bash", d)
    before = p.decide(TurnEnd("a", "Bash", 1000, tenant="tenant-a")).ttl_s
    for i in range(1000):
        p.workload.tool_called(None, f"fake-{i}", "Bash", now=0.0)
        p.workload.tool_called("tenant-x", f"fake-x-{i}", "Bash", now=0.0)
    for tenant in (None, "tenant-x"):
        p.workload.tools.advance(tenant, 100.0)
    assert p.workload.tools.get(None).running.overdue("Bash") == 1000
    assert p.decide(TurnEnd("a", "Bash", 1000, tenant="tenant-a")).ttl_s == before == pytest.approx(0.8)
    for i in range(1000):
        p.workload.tool_called("tenant-a", f"fake-a-{i}", "Bash", now=0.0)
    p.workload.tools.advance("tenant-a", 100.0)
    assert p.decide(TurnEnd("a", "Bash", 1000, tenant="tenant-a")).ttl_s == 0.0


def test_salted_tenants_are_bounded_and_a_forgotten_one_holds():
    """Past MAX_TENANTS salted tenants the least recently recorded is
    forgotten: its next pins decide with no durations (held as `forever`,
    looked at again), never shorter; the unsalted tenant is kept."""
    p = rule(revisit_s=5.0)
    p.workload.tool_returned(None, "u", "Bash", 0.5)
    p.workload.tool_returned("tenant-a", "a", "ci", 200.0)
    assert p.decide(TurnEnd("a", "ci", 1000, tenant="tenant-a")).ttl_s == 0.0
    for i in range(MAX_TENANTS):  # a flood of fresh salts
        p.workload.tool_returned(f"salt-{i}", f"s{i}", "x", 1.0)
    assert p.workload.tools.get("tenant-a") is None and p.workload.tools.get(None) is not None
    decision = p.decide(TurnEnd("a", "ci", 1000, tenant="tenant-a"))
    assert (decision.ttl_s, decision.source) == (5.0, "no durations")


def test_a_salted_tenant_keeps_a_bounded_number_of_tools():
    stats = ToolStats(history_limit=10)
    for i in range(3 * TOOLS_PER_TENANT):
        stats.returned("tenant-a", "a", f"tool-{i}", 1.0)
    assert len(stats.of("tenant-a").durations.tools()) == TOOLS_PER_TENANT
    assert len(stats.of("tenant-a").durations.all_tools) == 10
