"""What the TTL rules learn of tool calls, kept apart per tenant.

A tool's name is a label any client chooses (`continuum_tool`, or its own
tool definitions), and its calls are the clients' to make: pooled over
everyone, one client sending calls of "Bash" that never return would switch
pinning off for every other client's Bash (issue 46). So the durations
(durations.py) and the calls in flight (running_calls.py) are kept per
tenant, and a decision reads only its own tenant's.

A tenant is what vLLM already isolates by: a request's `cache_salt`
(vLLM's multi-tenant isolation of the prefix cache, which changes every
block hash), requests without one forming one tenant, as they share one
prefix cache. Within a tenant the calls are pooled, as the paper pools them:
a program's first calls of a slow tool are known to be slow from the others'.

Bounded: the unsalted tenant, and at most `max_tenants` salted ones, the
least recently recorded forgotten first. A forgotten tenant's pins hold as
`forever` holds them until it has calls again (the rules hold without
evidence), so a flood of salts can lengthen other tenants' pins, never
shorten them; each salted tenant keeps at most `tools_per_tenant` tools.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from vllm_continuum.core.durations import ToolDurations
from vllm_continuum.core.running_calls import RunningCalls

Tenant = str | None  # a request's cache_salt: None for requests without one
MAX_TENANTS = 16  # salted tenants whose statistics are kept
TOOLS_PER_TENANT = 64  # tools kept per salted tenant (the unsalted one keeps 1,024)


def salted_entry(table: OrderedDict, tenant: str, max_tenants: int, new):
    """`table[tenant]`, made by `new()` if missing (the least recently used of
    `max_tenants` forgotten first), and now the most recently used."""
    entry = table.get(tenant)
    if entry is None:
        if len(table) >= max_tenants:
            table.popitem(last=False)
        entry = table[tenant] = new()
    else:
        table.move_to_end(tenant)
    return entry


class TenantTools:
    """One tenant's calls: durations per tool and over all its tools, and its
    calls in flight."""

    __slots__ = ("durations", "running")

    def __init__(self, durations: ToolDurations, running: RunningCalls) -> None:
        self.durations, self.running = durations, running


class ToolStats:
    def __init__(self, history_limit: int, max_tenants: int = MAX_TENANTS) -> None:
        self.history_limit = history_limit
        self.max_tenants = max_tenants
        self._running_args: tuple[float, float, int] = (math.inf, math.inf, 1_000_000)
        self._unsalted = self._new(None)
        self._salted: OrderedDict[str, TenantTools] = OrderedDict()
        self.num_samples = 0  # ever recorded, over every tenant

    def track_running_calls(self, overdue_after_s: float, forget_after_s: float,
                            max_calls: int) -> None:
        """Count each tenant's calls out past `overdue_after_s` (a policy reads them)."""
        self._running_args = (overdue_after_s, forget_after_s, max_calls)
        self._unsalted.running = RunningCalls(*self._running_args)

    def get(self, tenant: Tenant) -> TenantTools | None:
        """The tenant's statistics, if it has any. O(1); reads change nothing."""
        return self._unsalted if tenant is None else self._salted.get(tenant)

    def of(self, tenant: Tenant) -> TenantTools:
        """The tenant's statistics, made if new (the least recently recorded
        salted tenant forgotten past `max_tenants`)."""
        if tenant is None:
            return self._unsalted
        return salted_entry(self._salted, tenant, self.max_tenants, lambda: self._new(tenant))

    def called(self, tenant: Tenant, session: str, tool: str, now: float) -> None:
        """A turn of `session` ended calling `tool`."""
        self.of(tenant).running.start(session, tool, now)

    def returned(self, tenant: Tenant, session: str, tool: str, seconds: float) -> None:
        """The session's call of `tool` returned after `seconds` (its next turn arrived)."""
        tools = self.of(tenant)
        tools.running.returned(session)
        tools.durations.add(tool, seconds)
        self.num_samples += 1

    def advance(self, tenant: Tenant, now: float) -> None:
        """Move the tenant's calls in flight on to `now` (before a decision reads them)."""
        tools = self.get(tenant)
        if tools is not None:
            tools.running.advance(now)

    def _new(self, tenant: Tenant) -> TenantTools:
        max_tools = 1024 if tenant is None else TOOLS_PER_TENANT
        return TenantTools(ToolDurations(self.history_limit, max_tools), RunningCalls(*self._running_args))
