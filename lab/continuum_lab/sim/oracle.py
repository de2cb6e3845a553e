"""The oracles: TTL policies that know each tool call's real duration, and a
program order that knows each program's remaining work.

Only a simulator knows that duration (the trace says it), so these policies
bound what a TTL policy can buy: `oracle` pins every tool call for exactly
its duration, `oracle-eq2` takes the paper's Eq. 2 with a perfect predictor.
policies.py gives them to the continuum scheduler of the `oracle*` policies.

Under memory pressure `oracle` is a weak bound, for two reasons: a pin
expires at the return, though under load the returning turn may queue for
longer than the one step of grace (it then loses its cache, where `forever`
keeps it), and some pins are taken back by pressure before their return,
their memory spent for nothing. `oracle-hindsight` (run.py's `simulate`)
knows both from the runs before it (`Hindsight`): it runs `oracle`, then
again with each pin lasting until its next turn was admitted last time and
without the pins pressure released, for up to HINDSIGHT_PASSES runs, and
keeps the best.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_continuum.config import ContinuumConfig
from vllm_continuum.core.pin_table import Pin, ReleaseReason
from vllm_continuum.core.program_order import ProgramOrder
from vllm_continuum.core.programs import Program
from vllm_continuum.core.lost_pin import lost_pin_s
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.running_calls import LATE_RETURN_S
from vllm_continuum.core.ttl import TTLDecision, TTLPolicy, TurnEnd, optimal_ttl
from vllm_continuum.core.workload import WorkloadModel
from continuum_lab.sim.cost_model import CostModel
from vllm_continuum.metrics.stats import ContinuumStats

HINDSIGHT_PASSES = 3  # oracle runs of `oracle-hindsight`, at most


class OracleTTLPolicy(TTLPolicy):
    """A TTL policy that knows each tool call's real duration (from the trace).

    mode "always" (policy `oracle`): every tool call is pinned for exactly its
    real duration plus `slack_s`, the longest a step can take, since a turn
    that arrives during a step is added at the step's end. A pin then never
    outlives its use (the next turn takes it over when admitted) and is given
    up early only if that turn queues more than the one grace step the hard
    TTL bound allows: the most reuse a TTL can buy, at the least pinned time.
    It is not capped by `max_ttl_s`. It is bounded, like every policy, by the
    pinned-memory caps and the pressure policy.

    mode "cap" (policy `oracle-cap-program`): the same within `max_ttl_s`,
    the bound every rule of the product keeps: a call that returns within
    the cap (and the late-return margin) is pinned for its duration, any
    other not at all. What a retention rule that knew each call's duration
    would do under the cap.

    mode "eq2" (policy `oracle-eq2`): the paper's Eq. 2 with a perfect
    predictor: P(tau) is a step at the real duration d, so pin for d (+ slack)
    iff B = T * eta + PrefillReload(r) exceeds d, with T, eta measured online
    and the prefill profile, exactly as the `continuum` policy computes B.
    """

    name = "oracle"

    def __init__(
        self,
        durations: Callable[[str], float | None],
        slack_s: float,
        mode: str = "always",
        benefit: Callable[[TurnEnd], float] | None = None,
        cap_s: float = float("inf"),
    ) -> None:
        super().__init__(max_ttl_s=float("inf"))
        self.cap_s = cap_s  # mode "cap": calls longer than this are not pinned
        self.durations = durations
        self.slack_s = slack_s
        self.mode = mode
        self.benefit = benefit

    def choose(self, turn: TurnEnd) -> TTLDecision:
        d = self.durations(turn.session_id)
        if d is None:
            return TTLDecision(0.0, "oracle: unknown")
        if self.mode == "eq2":
            b = self.benefit(turn) if self.benefit else 0.0
            if optimal_ttl([d], b) <= 0 and not (d == 0 and b > 0):
                return TTLDecision(0.0, "oracle-eq2: not worth it")
        if self.mode == "cap" and d > self.cap_s + LATE_RETURN_S:
            return TTLDecision(0.0, "oracle-cap: outlasts the cap")
        return TTLDecision(d + self.slack_s, f"oracle-{self.mode}")


def oracle_policy_factory(
    durations: Callable[[str], float | None], cost: CostModel, mode: str,
    prefill_profile_path: str | None,
) -> Callable[[ContinuumConfig, WorkloadModel], TTLPolicy]:
    """The scheduler's TTL policy factory (`continuum_ttl_policy=`) for the oracle
    policies. In mode "eq2", B is computed as the `continuum` policy computes it:
    T and eta from the scheduler's own online measurements (`workload`), the
    reload from the prefill profile."""

    def make(config: ContinuumConfig, workload: WorkloadModel) -> TTLPolicy:
        if mode != "eq2":
            return OracleTTLPolicy(durations, slack_s=cost.max_step_s(), mode=mode,
                                   cap_s=config.max_ttl_s)
        profile = PrefillProfile.load_or_default(prefill_profile_path)

        def benefit(turn: TurnEnd) -> float:
            return max(0.0, workload.mean_queueing_delay_s * workload.eta
                       + lost_pin_s(profile, turn.num_context_tokens, turn.held))

        return OracleTTLPolicy(durations, slack_s=cost.max_step_s(), mode=mode, benefit=benefit)

    return make


class PressureReleases(ContinuumStats):
    """A simulation's pin statistics that also remember which turns were
    pinned and whose pins pressure released: (program, turn), from the
    simulator's request ids ("PROGRAM/TURN/N")."""

    def __init__(self) -> None:
        super().__init__(writer=None)
        self.pinned: set[tuple[str, int]] = set()
        self.turns: set[tuple[str, int]] = set()  # released under pressure

    @staticmethod
    def _turn(pin: Pin) -> tuple[str, int]:
        program, turn, _ = pin.request_id.rsplit("/", 2)
        return program, int(turn)

    def on_pin(self, pin: Pin) -> None:
        super().on_pin(pin)
        self.pinned.add(self._turn(pin))

    def on_release(self, pin: Pin, reason: ReleaseReason, now: float) -> None:
        super().on_release(pin, reason, now)
        if reason is ReleaseReason.PRESSURE:
            self.turns.add(self._turn(pin))


@dataclass(frozen=True)
class Hindsight:
    """What `oracle-hindsight` knows from the runs before this one, per
    (program, turn): the turns whose pins pressure took back (not pinned
    again), and how long each turn waited to be admitted after it arrived
    (the pin of the turn before it lasts that much longer)."""

    skips: frozenset[tuple[str, int]] = frozenset()
    waits: dict[tuple[str, int], float] = field(default_factory=dict)

    def pin_s(self, program: str, turn: int, tool_s: float | None) -> float | None:
        """How long the oracle pins turn `turn`'s tool call (None: not at all)."""
        if tool_s is None or (program, turn) in self.skips:
            return None
        return tool_s + self.waits.get((program, turn + 1), 0.0)

    def after(self, skips: set[tuple[str, int]], waits: dict[tuple[str, int], float]) -> Hindsight:
        return Hindsight(self.skips | skips, waits)


@dataclass(frozen=True)
class RemainingWorkOrder(ProgramOrder):
    """The order oracle (`order-oracle`): programs ranked by the work they have
    left, the least first (shortest remaining processing time), from the
    trace: what an order that knew every program's length would do, the
    bound attained service (`program_order: service`) approximates without
    knowing it. `remaining(session, turns_done)`: the tokens the program's
    remaining turns add (its new prompt tokens and outputs)."""

    remaining: Callable[[str, int], float] = lambda session, turns_done: 0.0

    def rank(self, program: Program) -> float:
        return self.remaining(program.session, program.turns)


def remaining_work_order(remaining: Callable[[str, int], float]) -> Callable[[ContinuumConfig], ProgramOrder]:
    """The scheduler's program order factory for `order-oracle`."""
    return lambda config: RemainingWorkOrder(config.admission, config.program_precedence_s,
                                             remaining=remaining)
