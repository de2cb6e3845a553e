"""A tool-aware retention rule: keep a pin while its tool may still return
within the cap and that is worth the memory, re-decided as the pause goes on.

At elapsed time a into a call of tool f (0 when the turn ends), the pin is
held to the horizon h in (a, max_ttl_s] that maximises

    P(D <= h | D > a) * B  -  c * E[min(D, h) - a | D > a]

or released now if no horizon has a positive value. D is f's duration; B
what reuse saves, the reload (`PrefillReload`, the context's prefill) plus
T, the measured mean queueing delay of turns that came back to find their
context gone (with a host tier, vLLM's KV offload: a reload of what the
host holds and a prefill of the rest, lost_pin.py). The cost is the
memory-time the pin is expected to hold from now (a pin whose tool
returns early stops costing then) at a price c: zero
while the pool is not contested (no allocation failed for lack of blocks
in the last few seconds, `WorkloadModel.contested`: nobody would use the
memory, so the pin is held as `forever` holds it, whatever its size), and
else a small price (`idle_cost`), the same whoever waits: requests entitled to pinned memory
(one-shots, preempted requests, overdue turns) take it through the pressure
rule when they need it (`pressure.py`), so charging for them here would
count their claim twice (measured: it let pins go whose turns came back);
programs that arrived later wait for room under program admission anyway.
So a tool that may return within the cap is held as `forever` holds it, and
one that cannot (its recorded calls outlast what is left of `max_ttl_s`)
is let go at once, its memory back to the pool for the next program.

A call counts as returning in time if it returns within `late_return_s`
after the cap: a duration is measured from the end of a turn to the
arrival of the next, so a tool that times out at the cap is measured just
past it, and the releaser lets pins go only at a step's start.

The decision is revisited: the pin's TTL is the chosen horizon, at most
`revisit_s` ahead, and when it passes the pin releaser asks again
(`revisit`) with the elapsed time conditioned on. A call that has already
run long is likely a slow one: once the calls that took that long mostly
outlasted the cap, the pin goes. A pin whose next turn is already queued
is held to the cap (`PinController._revisit`): its call has returned.

D's distribution is the tool's own calls mixed with all tools' by
`prior_samples` pseudo-samples (weights n / (n + k0)), so a tool's own
calls count from the first few. Its own calls are those that returned and
those still out past the cap (running_calls.py), durations known to
outlast it: a slow tool's first calls return minutes later, while its
pins are decided now. Both are the pin's tenant's only (tool_stats.py: its
`cache_salt`): no tenant's calls change another's TTLs.

A call that has outlasted every recorded one (of any tool) is held if its
tool has calls of its own (nothing is known about this one), and let go if
not, once at least COLD_EVIDENCE_SAMPLES calls are recorded: a tool never
seen to return, whose call has run longer than any of ten or more calls
ever did, is most likely a slow one. (Holding those as `forever` does, at
a cold start, made a new program wait behind the first CI runs' pins;
letting them go with fewer calls recorded lost pins of ordinary tools at
the start of a short batch.) With no duration recorded at all the rule
holds (as `forever`) and looks again after `revisit_s`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import numpy as np

from vllm_continuum.config import ContinuumConfig
from vllm_continuum.core.lost_pin import NOTHING_HELD, Held, lost_pin_s
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.running_calls import LATE_RETURN_S
from vllm_continuum.core.tool_stats import Tenant, TenantTools
from vllm_continuum.core.ttl import TTLDecision, TTLPolicy, TurnEnd
from vllm_continuum.core.workload import WorkloadModel

# A call of a tool never seen to return is let go once it has outlasted this
# many recorded calls (of any tool): were its tool like theirs, it would
# outlast all n of them with probability 1 / (n + 1), under 10% here.
COLD_EVIDENCE_SAMPLES = 10
# Samples from which `best_horizon` scans in numpy (below, Python is faster).
VECTOR_FROM = 64
# Tools whose merged samples are kept (the most recently decided).
MERGED_TOOLS = 64


def best_horizon(
    parts: Sequence[tuple[float, Sequence[float], int]],
    elapsed: float,
    limit: float,
    benefit_s: float,
    cost: float,
    hold_unknown: bool = True,
    merged: Callable[[], Merged] | None = None,
) -> float:
    """The horizon h in (elapsed, limit] that maximises
    P(D <= h | D > elapsed) * benefit - cost * E[min(D, h) - elapsed | D > elapsed],
    D a mixture of empirical distributions (weight, sorted samples, number
    of further samples known to exceed `limit`), or `elapsed` (release now)
    if none has a positive value. Ties go to the shorter horizon. If the
    call has outlasted every sample (no information): `limit` (hold) if
    `hold_unknown`, else `elapsed`.

    At no cost the value only grows with h: the last sample in (elapsed,
    limit], found by binary search. Else one pass over the samples in
    (elapsed, limit]; from VECTOR_FROM of them (a busy tool's history: up
    to `duration_history` samples per part) the pass runs in numpy, with
    the same arithmetic in the same order, so the same horizon. `merged`,
    if given, returns `Merged.of(parts)`: a caller deciding often on
    unchanged parts builds it once."""
    if not benefit_s > 0 or limit <= elapsed:
        return elapsed
    # The conditional distribution beyond `elapsed`: each sample up to
    # `limit` with its weight; survivors = P(D > elapsed), up to the
    # mixture's normalisation.
    ranges: list[tuple[Sequence[float], int, int, float]] = []
    survivors = 0.0
    for weight, samples, beyond in parts:
        if weight <= 0 or not (samples or beyond):
            continue
        start = bisect.bisect_right(samples, elapsed)
        w = _per_sample(weight, samples, beyond)
        ranges.append((samples, start, bisect.bisect_right(samples, limit, start), w))
        survivors += w * (len(samples) - start + beyond)
    if survivors <= 0:  # the call outlasted every recorded one: nothing is known
        return limit if hold_unknown else elapsed
    if cost == 0:  # every sample in range adds to the value: the last one is best
        return max((xs[end - 1] for xs, start, end, _ in ranges if end > start), default=elapsed)
    if sum(end - start for _, start, end, _ in ranges) >= VECTOR_FROM:
        return _best_of_many(merged() if merged is not None else Merged.of(parts),
                             elapsed, limit, benefit_s, cost, survivors)
    tail = sorted((x, w) for xs, start, end, w in ranges for x in xs[start:end])
    best_h, best_value = elapsed, 0.0
    returned = 0.0  # P(elapsed < D <= h) * survivors
    held = 0.0  # sum over returned samples of w * (x - elapsed)
    i, n = 0, len(tail)
    while i < n:
        h = tail[i][0]
        while i < n and tail[i][0] == h:
            returned += tail[i][1]
            held += tail[i][1] * (h - elapsed)
            i += 1
        p = returned / survivors
        expected_hold = (held + (survivors - returned) * (h - elapsed)) / survivors
        value = p * benefit_s - cost * expected_hold
        if value > best_value:
            best_h, best_value = h, value
    return best_h


def _per_sample(weight: float, samples: Sequence[float], beyond: int) -> float:
    """A part's weight on each of its samples (and on each known to outlast the limit)."""
    return weight / (len(samples) + beyond)


class Merged:
    """Every sample of a mixture's parts with its weight, in the Python pass's
    order (a stable sort of the parts by weight, then of their samples by
    value), and the pass's running sums from the first sample (those of a
    decision at turn end, where no time has elapsed)."""

    def __init__(self, xs: np.ndarray, ws: np.ndarray) -> None:
        self.xs, self.ws = xs, ws
        self.returned, self.held = np.cumsum(ws), np.cumsum(ws * (xs - 0.0))

    @classmethod
    def of(cls, parts: Sequence[tuple[float, Sequence[float], int]]) -> Merged:
        kept = sorted(((_per_sample(weight, samples, beyond), samples) for weight, samples, beyond in parts
                       if weight > 0 and samples), key=lambda part: part[0])
        if not kept:
            return cls(np.empty(0), np.empty(0))
        xs = np.concatenate([np.asarray(samples, dtype=np.float64) for _, samples in kept])
        ws = np.concatenate([np.full(len(samples), w) for w, samples in kept])
        order = np.argsort(xs, kind="stable")
        return cls(xs[order], ws[order])


def _best_of_many(merged: Merged, elapsed: float, limit: float, benefit_s: float, cost: float,
                  survivors: float) -> float:
    """`best_horizon`'s pass over the samples in (elapsed, limit] in numpy: the
    same sums, accumulated in the same order (from the first sample they are
    the merge's own); the first maximum wins if it is positive. (Within a run
    of equal samples the value only grows, so the run's last one is where
    the Python pass evaluates it.)"""
    xs = merged.xs
    lo, hi = int(np.searchsorted(xs, elapsed, "right")), int(np.searchsorted(xs, limit, "right"))
    xs = xs[lo:hi]
    gap = xs - elapsed
    if lo == 0 and elapsed == 0.0:
        returned, held = merged.returned[:hi], merged.held[:hi]
    else:
        ws = merged.ws[lo:hi]
        returned, held = np.cumsum(ws), np.cumsum(ws * gap)
    value = returned / survivors * benefit_s - cost * ((held + (survivors - returned) * gap) / survivors)
    best = int(np.argmax(value))
    return float(xs[best]) if value[best] > 0 else elapsed


class HazardTTLPolicy(TTLPolicy):
    """The retention rule of the module's docstring (`ttl_policy: hazard`)."""

    name = "hazard"
    reads_running_calls = True

    def __init__(
        self,
        workload: WorkloadModel,
        profile: PrefillProfile,
        max_ttl_s: float,
        *,
        prior_samples: float = 3.0,
        revisit_s: float = 5.0,
        idle_cost: float = 0.02,
        late_return_s: float = LATE_RETURN_S,
    ) -> None:
        super().__init__(max_ttl_s)
        self.workload = workload
        self.profile = profile
        self.prior_samples = prior_samples
        self.revisit_s = revisit_s
        self.idle_cost = idle_cost
        self.late_return_s = late_return_s
        # Per (tenant, tool), its mixture's samples merged (`Merged`) and what
        # they were merged from: rebuilt once a duration or a late call is
        # recorded, so the decisions between two of those (a busy step's)
        # share one merge.
        self._merged: dict[tuple[Tenant, str], tuple[tuple, Merged]] = {}

    @classmethod
    def from_config(
        cls, config: ContinuumConfig, workload: WorkloadModel, **constants: float
    ) -> HazardTTLPolicy:
        """The rule `ttl_policy: hazard` builds; `constants` change its keyword
        constants (the simulator's `hazard-prior-*` / `hazard-price-*` labels)."""
        profile = PrefillProfile.load_or_default(config.prefill_profile)
        return cls(workload, profile, config.max_ttl_s, **constants)

    def profile_note(self, max_model_len: int) -> str | None:
        return self.profile.clamp_note(max_model_len)

    def benefit_s(self, num_context_tokens: int, held: Held = NOTHING_HELD) -> float:
        """B: what losing the pin costs its next turn (a reload of what a host
        tier holds, a prefill of the rest: lost_pin.py), plus T."""
        return lost_pin_s(self.profile, num_context_tokens, held) + self.workload.mean_queueing_delay_s

    def price(self) -> float:
        """What a second of the pin's memory costs: nothing unless the pool is contested."""
        return self.idle_cost if self.workload.contested else 0.0

    def parts(self, tool: str, tools: TenantTools | None) -> tuple[tuple[float, Sequence[float], int], ...]:
        """The tool's duration mixture in its tenant's calls: its own samples
        (returned calls, and calls still out past the cap), weight n / (n + k0),
        and all tools' for the rest."""
        if tools is None:
            return ()
        history = tools.durations.of(tool)
        own = history.sorted if history is not None else []
        own_late = tools.running.overdue(tool)
        n = len(own) + own_late
        w_own = n / (n + self.prior_samples)
        mine = (w_own, own, own_late)
        pooled, pooled_late = tools.durations.all_tools.sorted, tools.running.num_overdue
        return (mine, (1.0 - w_own, pooled, pooled_late)) if pooled or pooled_late else (mine,)

    def hold_for(self, tool: str, elapsed: float, num_context_tokens: int,
                 tenant: Tenant = None, held: Held = NOTHING_HELD) -> tuple[float, str]:
        """(how much longer to hold from `elapsed`, the source): 0 = release now."""
        limit = self.max_ttl_s
        rest = limit - elapsed
        if rest <= 0:
            return 0.0, "cap"
        tools = self.workload.tools.get(tenant)
        parts = self.parts(tool, tools)
        if not any(samples or beyond for _, samples, beyond in parts):
            return min(rest, self.revisit_s), "no durations"
        known = parts[0][0] > 0  # the tool has calls of its own (returned or out past the cap)
        source = "tool+all durations" if known else "all durations"
        hold_unknown = known or len(tools.durations.all_tools) < COLD_EVIDENCE_SAMPLES
        h = best_horizon(parts, elapsed, limit + self.late_return_s,
                         self.benefit_s(num_context_tokens, held), self.price(), hold_unknown=hold_unknown,
                         merged=lambda: self._merged_parts((tenant, tool), tools, parts))
        if h <= elapsed:
            return 0.0, source
        return min(h - elapsed, rest, self.revisit_s), source

    def _merged_parts(self, key: tuple[Tenant, str], tools: TenantTools, parts) -> Merged:
        """`Merged.of(parts)`, rebuilt only when the parts changed: a duration
        recorded (any tool's of the tenant: the pooled part) or a call's count
        past the cap."""
        version = (tools.durations.num_samples, tuple((w, n) for w, _, n in parts))
        cached = self._merged.pop(key, None)  # (re-inserted: the newest last)
        if cached is None or cached[0] != version:
            cached = (version, Merged.of(parts))
        self._merged[key] = cached
        if len(self._merged) > MERGED_TOOLS:
            del self._merged[next(iter(self._merged))]
        return cached[1]

    def choose(self, turn: TurnEnd) -> TTLDecision:
        ttl, source = self.hold_for(turn.tool, 0.0, turn.num_context_tokens, turn.tenant, turn.held)
        return TTLDecision(ttl, source, revisable=ttl > 0)

    def revisit(self, tool: str, elapsed: float, num_context_tokens: int,
                tenant: Tenant = None, held: Held = NOTHING_HELD) -> float:
        """How much longer a pin `elapsed` seconds old keeps its blocks (0: release)."""
        return self.hold_for(tool, elapsed, num_context_tokens, tenant, held)[0]
