"""Build the real schedulers for simulation: vLLM's `Scheduler` (stock) and our
`ContinuumScheduler` under each policy, with the modelled server's KV pool.

The schedulers are built without a model (`scheduler_factory`): vLLM's
scheduler, KV cache manager, block pool and prefix cache, driven by synthetic
outputs.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vllm_continuum.atomic_dir import replacing_dir
from vllm_continuum.config import ContinuumConfig, load_config
from vllm_continuum.core.pressure import pressure_variants
from vllm_continuum.core.ttl import TTLDecision, TTLPolicy, TurnEnd, optimal_ttl
from vllm_continuum.core.workload import WorkloadModel
from vllm_continuum.experiments.sim.cost_model import CostModel
from vllm_continuum.experiments.sim.driver import new_scheduler

# name -> (continuum scheduler?, CONTINUUM_* settings). "oracle*" get OracleTTLPolicy.
# A plain name runs under the configured pressure policy; -yield / -hold pick one.
POLICIES: dict[str, tuple[bool, dict[str, str]]] = {
    "stock": (False, {}),
    "never": (True, {"TTL_POLICY": "never"}),
} | {
    label: (True, settings)
    for name, ttl in (("continuum", "continuum"), ("fixed", "fixed"), ("forever", "forever"),
                      ("oracle", "never"), ("oracle-eq2", "never"))
    for label, settings in pressure_variants(name, {"TTL_POLICY": ttl}, "PRESSURE_POLICY").items()
}


class SimClock:
    """The simulated clock: the scheduler reads it, the event loop moves it."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


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


def sim_config(settings: dict[str, str]) -> ContinuumConfig:
    """A scheduler's config from CONTINUUM_*-style settings ({"TTL_POLICY": "never"},
    JSON for mappings and lists), independent of the process environment."""
    fields = {k.lower(): (json.loads(v) if v[:1] in "{[" else v) for k, v in settings.items()}
    return load_config(use_env=False, **fields)


def sim_model_dir(max_model_len: int) -> str:
    """A model directory for vLLM's ModelConfig: the tiny model's tokenizer and
    config, with a context window as long as the modelled model's (no weights
    are loaded by the scheduler)."""
    from vllm_continuum.tiny_model import build_tiny_model

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vllm-continuum"
    tiny = build_tiny_model(cache / "tiny-model")
    target = cache / f"sim-model-{max_model_len}"
    marker = target / "config.json"
    if marker.is_file() and json.loads(marker.read_text()).get("max_position_embeddings") == max_model_len:
        return str(target)
    with replacing_dir(target) as tmp:
        for f in tiny.iterdir():
            if f.is_file() and f.name != "model.safetensors":
                shutil.copy(f, tmp / f.name)
        config = json.loads((tmp / "config.json").read_text())
        config["max_position_embeddings"] = max_model_len
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
    return str(target)


def oracle_policy_factory(
    durations: Callable[[str], float | None], cost: CostModel, mode: str,
    prefill_profile_path: str | None,
) -> Callable[[ContinuumConfig, WorkloadModel], TTLPolicy]:
    """The scheduler's TTL policy factory for the oracle policies."""

    def make(config: ContinuumConfig, workload: WorkloadModel) -> TTLPolicy:
        benefit = None
        if mode == "eq2":
            from vllm_continuum.core.prefill_profile import PrefillProfile

            profile = PrefillProfile.load(prefill_profile_path) if prefill_profile_path else PrefillProfile()

            def benefit(turn: TurnEnd) -> float:
                return max(0.0, workload.mean_queueing_delay_s * workload.eta
                           + profile.seconds(turn.num_context_tokens))

        return OracleTTLPolicy(durations, slack_s=cost.max_step_s(), mode=mode, benefit=benefit)

    return make


@dataclass
class BuiltScheduler:
    scheduler: object
    policy: str
    continuum: bool
    settings: dict[str, str] = field(default_factory=dict)


def build_scheduler(
    policy: str,
    cost: CostModel,
    clock: SimClock,
    *,
    prefill_profile_path: str | None = None,
    extra_settings: dict[str, str] | None = None,
    oracle_durations: Callable[[str], float | None] | None = None,
) -> BuiltScheduler:
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_continuum.adapter.scheduler import ContinuumScheduler

    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {sorted(POLICIES)}")
    is_continuum, base = POLICIES[policy]
    settings = {**base, **(extra_settings or {})}
    if prefill_profile_path:
        settings.setdefault("PREFILL_PROFILE", prefill_profile_path)
    cls = ContinuumScheduler if is_continuum else Scheduler
    extra: dict[str, object] = {}
    if is_continuum:
        extra = {"continuum_config": sim_config(settings), "continuum_clock": clock}
        if policy.startswith("oracle"):
            assert oracle_durations is not None
            extra["continuum_ttl_policy"] = oracle_policy_factory(
                oracle_durations, cost, "eq2" if policy.startswith("oracle-eq2") else "always",
                prefill_profile_path,
            )
    os.environ.pop("CONTINUUM_METRICS_DIR", None)  # no metrics export from a simulation
    scheduler = new_scheduler(
        cls, sim_model_dir(cost.max_model_len), num_blocks=cost.num_gpu_blocks,
        block_size=cost.block_size, max_model_len=cost.max_model_len,
        max_num_seqs=cost.max_num_seqs, max_num_batched_tokens=cost.max_num_batched_tokens,
        **extra,
    )
    return BuiltScheduler(scheduler, policy, is_continuum, settings if is_continuum else {})
