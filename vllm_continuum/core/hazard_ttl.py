"""A tool-aware retention rule: keep a pin while its tool may still return
within the cap and that is worth the memory, re-decided as the pause goes on.

At elapsed time a into a call of tool f (0 when the turn ends), the pin is
held to the horizon h in (a, max_ttl_s] that maximises

    P(D <= h | D > a) * B  -  c * E[min(D, h) - a | D > a]

or released now if no horizon has a positive value. D is f's duration; B
what reuse saves, the reload (`PrefillReload`, the context's prefill) plus
T, the measured mean queueing delay of turns that came back to find their
context gone. The cost is the memory-time the pin is expected to hold from
now (a pin whose tool returns early stops costing then) at a price c: zero
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

D's distribution is learned from the pin's own program only: its calls of
the tool mixed with all its calls by `prior_samples` pseudo-samples
(weights n / (n + k0)), so the tool's own calls count from the first few
(`CallHistory`: the program's last 32 calls that returned). Another
program's calls never enter it: tool names are labels any client chooses,
and a client that sent calls of "Bash" that never return would otherwise
switch pinning off for everyone's Bash (issue 46); now it can only make its
own pins useless.

A call that has outlasted every recorded one (of any tool) is held if its
tool has calls of its own (nothing is known about this one), and let go if
not, once at least COLD_EVIDENCE_SAMPLES calls are recorded: a tool never
seen to return, whose call has run longer than any of ten or more calls
the program made, is most likely a slow one. (Holding those as `forever`
does, at a cold start, made a new program wait behind the first CI runs'
pins; letting them go with fewer calls recorded lost pins of ordinary
tools at the start of a short batch.) With no duration recorded at all the
rule holds (as `forever`) and looks again after `revisit_s`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from vllm_continuum.config import ContinuumConfig
from vllm_continuum.core.durations import CallHistory
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.ttl import TTLDecision, TTLPolicy, TurnEnd
from vllm_continuum.core.workload import WorkloadModel

# A call that returns this soon after the cap returned in time.
LATE_RETURN_S = 0.5
# A call of a tool never seen to return is let go once it has outlasted this
# many recorded calls (of any tool): were its tool like theirs, it would
# outlast all n of them with probability 1 / (n + 1), under 10% here.
COLD_EVIDENCE_SAMPLES = 10


def best_horizon(
    parts: Sequence[tuple[float, Sequence[float]]],
    elapsed: float,
    limit: float,
    benefit_s: float,
    cost: float,
    hold_unknown: bool = True,
) -> float:
    """The horizon h in (elapsed, limit] that maximises
    P(D <= h | D > elapsed) * benefit - cost * E[min(D, h) - elapsed | D > elapsed],
    D a mixture of empirical distributions (weight, sorted samples), or
    `elapsed` (release now) if none has a positive value. Ties go to the
    shorter horizon. If the call has outlasted every sample (no
    information): `limit` (hold) if `hold_unknown`, else `elapsed`.

    At no cost the value only grows with h: the last sample in (elapsed,
    limit], found by binary search. Else one pass over the samples in
    (elapsed, limit] (a program's last calls: a few dozen)."""
    if not benefit_s > 0 or limit <= elapsed:
        return elapsed
    # The conditional distribution beyond `elapsed`: each sample up to
    # `limit` with its weight; survivors = P(D > elapsed), up to the
    # mixture's normalisation.
    ranges: list[tuple[Sequence[float], int, int, float]] = []
    survivors = 0.0
    for weight, samples in parts:
        if weight <= 0 or not samples:
            continue
        start = bisect.bisect_right(samples, elapsed)
        w = weight / len(samples)
        ranges.append((samples, start, bisect.bisect_right(samples, limit, start), w))
        survivors += w * (len(samples) - start)
    if survivors <= 0:  # the call outlasted every recorded one: nothing is known
        return limit if hold_unknown else elapsed
    if cost == 0:  # every sample in range adds to the value: the last one is best
        return max((xs[end - 1] for xs, start, end, _ in ranges if end > start), default=elapsed)
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


class HazardTTLPolicy(TTLPolicy):
    """The retention rule of the module's docstring (`ttl_policy: hazard`)."""

    name = "hazard"

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

    def benefit_s(self, num_context_tokens: int) -> float:
        return self.profile.seconds(num_context_tokens) + self.workload.mean_queueing_delay_s

    def price(self) -> float:
        """What a second of the pin's memory costs: nothing unless the pool is contested."""
        return self.idle_cost if self.workload.contested else 0.0

    def parts(self, tool: str, calls: CallHistory | None) -> tuple[tuple[float, Sequence[float]], ...]:
        """The tool's duration mixture, from its program's own calls: those of
        the tool, weight n / (n + k0), and all of them for the rest."""
        if calls is None or not len(calls):
            return ()
        own, pooled = calls.of(tool), calls.all()
        w_own = len(own) / (len(own) + self.prior_samples)
        return (w_own, own), (1.0 - w_own, pooled)

    def hold_for(self, tool: str, elapsed: float, num_context_tokens: int,
                 calls: CallHistory | None) -> tuple[float, str]:
        """(how much longer to hold from `elapsed`, the source): 0 = release now."""
        limit = self.max_ttl_s
        rest = limit - elapsed
        if rest <= 0:
            return 0.0, "cap"
        parts = self.parts(tool, calls)
        if not parts:
            return min(rest, self.revisit_s), "no durations"
        known = parts[0][0] > 0  # the tool has calls of its own in the program
        source = "tool+all durations" if known else "all durations"
        hold_unknown = known or len(parts[1][1]) < COLD_EVIDENCE_SAMPLES
        h = best_horizon(parts, elapsed, limit + self.late_return_s,
                         self.benefit_s(num_context_tokens), self.price(), hold_unknown=hold_unknown)
        if h <= elapsed:
            return 0.0, source
        return min(h - elapsed, rest, self.revisit_s), source

    def choose(self, turn: TurnEnd) -> TTLDecision:
        ttl, source = self.hold_for(turn.tool, 0.0, turn.num_context_tokens, turn.calls)
        return TTLDecision(ttl, source, revisable=ttl > 0)

    def revisit(self, tool: str, elapsed: float, num_context_tokens: int,
                calls: CallHistory | None) -> float:
        """How much longer a pin `elapsed` seconds old keeps its blocks (0: release),
        on its program's own calls."""
        return self.hold_for(tool, elapsed, num_context_tokens, calls)[0]
