"""The oracle TTL policies: pins sized by each tool call's real duration.

Only a simulator knows that duration (the trace says it), so these policies
bound what a TTL policy can buy: `oracle` pins every tool call for exactly
its duration, `oracle-eq2` takes the paper's Eq. 2 with a perfect predictor.
policies.py gives them to the continuum scheduler of the `oracle*` policies.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_continuum.config import ContinuumConfig
from vllm_continuum.core.prefill_profile import PrefillProfile
from vllm_continuum.core.ttl import TTLDecision, TTLPolicy, TurnEnd, optimal_ttl
from vllm_continuum.core.workload import WorkloadModel
from vllm_continuum.experiments.sim.cost_model import CostModel


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
    ) -> None:
        super().__init__(max_ttl_s=float("inf"))
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
            return OracleTTLPolicy(durations, slack_s=cost.max_step_s(), mode=mode)
        profile = PrefillProfile.load(prefill_profile_path) if prefill_profile_path else PrefillProfile()

        def benefit(turn: TurnEnd) -> float:
            return max(0.0, workload.mean_queueing_delay_s * workload.eta
                       + profile.seconds(turn.num_context_tokens))

        return OracleTTLPolicy(durations, slack_s=cost.max_step_s(), mode=mode, benefit=benefit)

    return make
