"""How long to keep a finished tool-call turn's KV cache pinned.

A TTL policy is the replaceable part of the design: the scheduler asks
`decide(turn)` when a turn ends in a tool call and pins for the answer (0
means do not pin). Every policy shares the same envelope: a client's
`continuum_ttl_s` hint wins over the policy's own choice, and `max_ttl_s`
caps everything, so no client and no model can hold memory longer than the
operator allows.

`ContinuumTTLPolicy` is the paper's Eq. 2. Pinning r for tau seconds costs
MemUsage(r)/M * tau and, if the tool returns within tau (probability
P(tau, f), the tool's empirical CDF), saves MemUsage(r)/M * (T * eta +
PrefillReload(r)). MemUsage/M cancels, leaving

    tau* = argmax over tau in {0} U {recorded durations of f} of
           P(tau, f) * B - tau,    B = T * eta + PrefillReload(r).

Two settings change its inputs: `duration_estimator: shrunk` (off by
default) replaces the switch to a tool's own CDF at K samples by a CDF
shrunk toward the all-tools one (`shrinkage.py`), and `pin_cost` (default
`demand`; `always` is the paper's) charges tau only while, or only for the
memory, waiting requests entitled to it need (`pin_value.py`). Such a pin
may outlive what Eq. 2 would give it at full cost; once those requests
need its blocks it holds only that long (`contested_ttl_s`).

`HazardTTLPolicy` (hazard_ttl.py) ships: `ForeverTTLPolicy`'s hold until
the next turn while the tool may still return within the cap, and a pin
let go once its tool's calls say it will not. Under program admission and
the waiting bound the rules around a pin keep it from costing others;
giving pins up at Eq. 2's contested TTL measured worse (docs/ttl-model.md).
"""

from __future__ import annotations

import bisect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from vllm_continuum.core.durations import ToolDurations
from vllm_continuum.core.lost_pin import NOTHING_HELD, Held, lost_pin_s
from vllm_continuum.core.pin_value import PoolState, pin_pressure
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.shrinkage import shrunk_cdf, shrunk_mean
from vllm_continuum.core.workload import WorkloadModel


NO_DURATIONS = ToolDurations(1)  # a tenant with no call recorded (read only)


@dataclass(frozen=True)
class TurnEnd:
    """What a policy may know about a turn that just ended in a tool call."""

    session_id: str
    tool: str
    num_context_tokens: int  # what the next turn would prefill again without a pin
    hinted_ttl_s: float | None = None
    tenant: str | None = None  # its request's cache_salt: whose tool statistics decide (tool_stats.py)
    held: Held = NOTHING_HELD  # of it, what a host tier holds (lost_pin.py): reloaded, not prefilled
    # With `pin_cost: pressure` only: the pool's state, and the blocks the pin
    # would add (no other pin or running request holds them; left 0 when the
    # free pool covers the waiting demand, where they do not change the cost).
    pool: PoolState | None = None  # None: no pressure information (Eq. 2 charges all)
    marginal_blocks: int = 0


@dataclass(frozen=True)
class TTLDecision:
    ttl_s: float
    source: str  # "hint", "cold start", "tool CDF", ... (logged and tested)
    # How long the pin is worth its memory once waiting requests need it (Eq. 2
    # at full cost): past this age it gives way to them. None: the whole TTL.
    contested_ttl_s: float | None = None
    # The policy decides again when the TTL passes (`revisit`), instead of
    # releasing the pin: its TTL is the next time to look, not the last.
    revisable: bool = False


class TTLPolicy(ABC):
    name: str
    honours_hints = True
    reads_pool = False  # its decisions read the pool's state (`TurnEnd.pool`)
    reads_running_calls = False  # ... and the calls out past the cap (`WorkloadModel.tools`)

    def __init__(self, max_ttl_s: float) -> None:
        self.max_ttl_s = max_ttl_s

    def decide(self, turn: TurnEnd) -> TTLDecision:
        if self.honours_hints and turn.hinted_ttl_s is not None:
            decision = TTLDecision(turn.hinted_ttl_s, "hint")
        else:
            decision = self.choose(turn)
        if decision.ttl_s > self.max_ttl_s:
            return self._capped(decision)
        return decision

    # The last decision capped, and its copy at the cap: a policy that returns
    # one constant decision (forever's) copies it once, not at every pin.
    _cap_of: tuple[TTLDecision, float, TTLDecision] | None = None

    def _capped(self, decision: TTLDecision) -> TTLDecision:
        """`decision` at `max_ttl_s`, its source marked."""
        last = self._cap_of
        if last is not None and last[0] is decision and last[1] == self.max_ttl_s:
            return last[2]
        capped = replace(decision, ttl_s=self.max_ttl_s, source=decision.source + "+cap")
        self._cap_of = (decision, self.max_ttl_s, capped)
        return capped

    @abstractmethod
    def choose(self, turn: TurnEnd) -> TTLDecision:
        """The policy's own TTL, before hints and the cap."""

    def profile_note(self, max_model_len: int) -> str | None:
        """What the policy has to say about its prefill profile, if anything."""
        return None


class FixedTTLPolicy(TTLPolicy):
    """A configured TTL per tool name, else a default."""

    name = "fixed"

    def __init__(
        self, default_ttl_s: float, tool_ttl_s: Mapping[str, float], max_ttl_s: float
    ) -> None:
        super().__init__(max_ttl_s)
        self.default_ttl_s = default_ttl_s
        self.tool_ttl_s = dict(tool_ttl_s)

    def choose(self, turn: TurnEnd) -> TTLDecision:
        if turn.tool in self.tool_ttl_s:
            return TTLDecision(self.tool_ttl_s[turn.tool], "tool")
        return TTLDecision(self.default_ttl_s, "default")


class NeverTTLPolicy(TTLPolicy):
    """Stock vLLM behaviour (never pin, hints ignored): the A/B baseline."""

    name = "never"
    honours_hints = False

    def choose(self, turn: TurnEnd) -> TTLDecision:
        return TTLDecision(0.0, "never")


_FOREVER = TTLDecision(math.inf, "forever")  # one object: its capped copy is made once


class ForeverTTLPolicy(TTLPolicy):
    """Pin until the next turn, the last turn or pressure (bounded by max_ttl_s)."""

    name = "forever"

    def choose(self, turn: TurnEnd) -> TTLDecision:
        return _FOREVER


def optimal_ttl(sorted_durations: Sequence[float], benefit_s: float) -> float:
    """tau* = argmax over tau in {0} U durations of P(tau) * benefit - tau.

    One pass over the sorted durations; ties go to the shorter TTL. Durations
    beyond the benefit cannot win (their value is negative), so the scan
    stops there.
    """
    n = len(sorted_durations)
    if n == 0 or not benefit_s > 0:  # NaN too
        return 0.0
    if math.isinf(benefit_s):  # any cost is worth a certain return: wait for the slowest
        return sorted_durations[-1]
    best_tau = 0.0
    best_value = bisect.bisect_right(sorted_durations, 0.0) / n * benefit_s
    i = 0
    while i < n:
        tau = sorted_durations[i]
        if tau >= benefit_s:
            break
        i = bisect.bisect_right(sorted_durations, tau, lo=i)  # P(tau) counts ties
        value = i / n * benefit_s - tau
        if value > best_value:
            best_tau, best_value = tau, value
    return best_tau


def exp1_ttl(benefit_s: float) -> float:
    """The optimum if durations were Exp(1): ln(B) when B > 1 s, else 0."""
    return math.log(benefit_s) if benefit_s > 1.0 else 0.0


class ContinuumTTLPolicy(TTLPolicy):
    """The paper's cost/benefit TTL, learned online from the server's own traffic."""

    name = "continuum"

    def __init__(
        self,
        workload: WorkloadModel,
        profile: PrefillProfile,
        cold_start_samples: int,
        max_ttl_s: float,
        *,
        prior_samples: float | None = None,
        pin_cost: str = "always",
    ) -> None:
        super().__init__(max_ttl_s)
        self.workload = workload
        self.profile = profile
        self.k = cold_start_samples
        self.prior_samples = prior_samples  # None: the paper's switch at K samples
        # `pin_cost`, resolved once: how Eq. 2's cost is charged.
        # (how, whether it reads the pool's state)
        costs = {"always": (self._at_full_cost, False), "demand": (self._on_demand, False),
                 "pressure": (self._at_pressure, True)}
        if pin_cost not in costs:
            raise ValueError(f"pin_cost must be one of {sorted(costs)}, not {pin_cost!r}")
        self._charged, self.reads_pool = costs[pin_cost]

    def profile_note(self, max_model_len: int) -> str | None:
        return self.profile.clamp_note(max_model_len)

    def benefit_s(self, turn: TurnEnd, eta: float) -> float:
        reload = lost_pin_s(self.profile, turn.num_context_tokens, turn.held)
        return max(0.0, self.workload.mean_queueing_delay_s * eta + reload)

    def choose(self, turn: TurnEnd) -> TTLDecision:
        """Eq. 2 on the configured CDF, at the cost `pin_cost` names."""
        return self._charged(turn, *self._eq2(turn))

    @staticmethod
    def _at_full_cost(turn: TurnEnd, ttl_at: Callable[[float], float], benefit: float,
                      source: str) -> TTLDecision:
        """always: Eq. 2's TTL."""
        return TTLDecision(ttl_at(benefit), source)

    @staticmethod
    def _on_demand(turn: TurnEnd, ttl_at: Callable[[float], float], benefit: float,
                   source: str) -> TTLDecision:
        """demand: no cost until someone waits (the TTL is `max_ttl_s`); then
        the pin holds against waiting requests only for Eq. 2's TTL at full
        cost (`contested_ttl_s`)."""
        return TTLDecision(math.inf, source, contested_ttl_s=ttl_at(benefit))

    @staticmethod
    def _at_pressure(turn: TurnEnd, ttl_at: Callable[[float], float], benefit: float,
                     source: str) -> TTLDecision:
        """pressure: Eq. 2 with the cost scaled by the pin's pressure now;
        contested as under demand."""
        pressure = pin_pressure(turn.pool, turn.marginal_blocks)
        per_cost = benefit / pressure if pressure > 0 else (math.inf if benefit > 0 else 0.0)
        return TTLDecision(ttl_at(per_cost), source, contested_ttl_s=ttl_at(benefit))

    def _eq2(self, turn: TurnEnd) -> tuple[Callable[[float], float], float, str]:
        """(tau*(B) on the turn's duration CDF, B, the CDF's name)."""
        tools = self.workload.tools.get(turn.tenant)  # its tenant's calls only
        durations = tools.durations if tools is not None else NO_DURATIONS
        if self.prior_samples is not None:
            cdf = shrunk_cdf(durations, turn.tool, self.prior_samples)
            programs = self.workload.programs
            eta = shrunk_mean(programs.eta, len(programs), 1.0, self.prior_samples)
            return cdf.best_ttl, self.benefit_s(turn, eta), "shrunk CDF"
        if durations.num_samples <= self.k:
            return exp1_ttl, self.benefit_s(turn, eta=1.0), "cold start"
        benefit = self.benefit_s(turn, self.workload.eta)
        history = durations.of(turn.tool)
        if history is None or len(history) <= self.k:
            pooled = durations.all_tools.sorted
            return (lambda b: optimal_ttl(pooled, b)), benefit, "global CDF"
        own = history.sorted
        return (lambda b: optimal_ttl(own, b)), benefit, "tool CDF"

