"""Build the real schedulers for simulation: vLLM's `Scheduler` (stock) and our
`ContinuumScheduler` under each policy, with the modelled server's KV pool.

The schedulers are built without a model (`scheduler_factory`): vLLM's
scheduler, KV cache manager, block pool and prefix cache, driven by synthetic
outputs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from vllm_continuum.atomic_dir import replacing_dir
from vllm_continuum.core.pressure import pressure_variants
from vllm_continuum.core.ttl import TTLDecision, TTLPolicy, TurnEnd, optimal_ttl
from vllm_continuum.sim.cost_model import CostModel
from vllm_continuum.sim.scheduler_factory import new_scheduler

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


@contextlib.contextmanager
def continuum_env(settings: dict[str, str]) -> Iterator[None]:
    """CONTINUUM_* variables for the scheduler's construction only."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("CONTINUUM_")}
    for k in saved:
        del os.environ[k]
    os.environ.update({f"CONTINUUM_{k}": v for k, v in settings.items()})
    try:
        yield
    finally:
        for k in [k for k in os.environ if k.startswith("CONTINUUM_")]:
            del os.environ[k]
        os.environ.update(saved)


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
    os.environ.pop("CONTINUUM_METRICS_DIR", None)  # no metrics export from a simulation
    with continuum_env(settings if is_continuum else {}):
        scheduler = new_scheduler(
            cls, sim_model_dir(cost.max_model_len), num_blocks=cost.num_gpu_blocks,
            block_size=cost.block_size, max_model_len=cost.max_model_len,
            max_num_seqs=cost.max_num_seqs, max_num_batched_tokens=cost.max_num_batched_tokens,
        )
    if is_continuum:
        scheduler.clock = clock
        if policy.startswith("oracle"):
            assert oracle_durations is not None
            mode = "eq2" if policy.startswith("oracle-eq2") else "always"
            benefit = None
            if mode == "eq2":
                from vllm_continuum.core.prefill_profile import PrefillProfile

                profile = PrefillProfile.load(prefill_profile_path) if prefill_profile_path else PrefillProfile()
                workload = scheduler.workload

                def benefit(turn: TurnEnd) -> float:
                    return max(0.0, workload.mean_queueing_delay_s * workload.eta
                               + profile.seconds(turn.num_context_tokens))

            scheduler.ttl_policy = OracleTTLPolicy(
                oracle_durations, slack_s=cost.max_step_s(), mode=mode, benefit=benefit
            )
    return BuiltScheduler(scheduler, policy, is_continuum, settings if is_continuum else {})
