"""The policies the simulator compares, and the real scheduler each one runs:
vLLM's `Scheduler` (stock) or our `ContinuumScheduler` under a TTL and a
pressure policy, with the modelled server's KV pool.

The schedulers are built without a model (driver.py): vLLM's scheduler, KV
cache manager, block pool and prefix cache, driven by synthetic outputs.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from vllm_continuum.config import ContinuumConfig, load_config
from vllm_continuum.core.hazard_ttl import HazardTTLPolicy
from continuum_lab.shipped_before import CAPPED as CAPPED_SETTINGS
from continuum_lab.shipped_before import DEMAND as DEMAND_SETTINGS
from continuum_lab.shipped_before import PRESSURE as PRESSURE_SETTINGS
from continuum_lab.shipped_before import pressure_variants
from continuum_lab.sim.cost_model import CostModel
from continuum_lab.sim.driver import SimClock, new_scheduler
from continuum_lab.sim.host_tier import HostTier, OffloadWorker
from continuum_lab.sim.oracle import oracle_policy_factory, remaining_work_order
from vllm_continuum.metrics.stats import ContinuumStats
from vllm_continuum.tools.atomic_dir import replacing_dir


def _as_sim_settings(settings: dict) -> dict[str, str]:
    """`shipped_before`'s config fields as this module's CONTINUUM_*-style settings."""
    return {k.upper(): str(v) for k, v in settings.items()}


# The caps every label below ran under before they opened (0.95 / 1.0): the
# labels keep them, so that a published result keeps its meaning.
CAPPED = _as_sim_settings(CAPPED_SETTINGS)
OPEN_CAPS = {"MAX_PINNED_FRACTION": "0.95", "MAX_SESSION_PINNED_FRACTION": "1"}
# The learned TTL at the pin cost every label of it below ran under before
# `demand`; and charged on demand, as it shipped until `forever` did.
PRESSURE = _as_sim_settings(PRESSURE_SETTINGS)
DEMAND = _as_sim_settings(DEMAND_SETTINGS)

# The paper's settings besides the TTL policy: the baselines run with them
# whatever the shipped defaults are, so that a label keeps its meaning. They
# put every request under the 1 s waiting bound (`admission: request`).
PAPER = {"QUEUE_ORDER": "program_fcfs", "PIN_COST": "always", "DURATION_ESTIMATOR": "cliff",
         "ADMISSION": "request", **CAPPED}

# The candidates: Eq. 2 with one setting changed each, and the
# combinations the measurements led to (docs/results/benchmarks-archive.md, "Issue 12").
CANDIDATES: dict[str, dict[str, str]] = {
    "continuum-shrunk": {"TTL_POLICY": "continuum", **PAPER, "DURATION_ESTIMATOR": "shrunk"},
    "continuum-pressure": {"TTL_POLICY": "continuum", **PAPER, "PIN_COST": "pressure"},
    "adaptive": {"TTL_POLICY": "continuum", **PAPER, "PIN_COST": "pressure",
                 "QUEUE_ORDER": "sessionless_first"},
    "adaptive-demand": {"TTL_POLICY": "continuum", **PAPER, "PIN_COST": "demand",
                        "QUEUE_ORDER": "sessionless_first"},
    "forever-sessionless-first": {"TTL_POLICY": "forever", **PAPER,
                                  "QUEUE_ORDER": "sessionless_first"},
    "fixed-8s": {"TTL_POLICY": "fixed", "DEFAULT_TTL_S": "8", **PAPER},
}

# Request admission (every request under the 1 s bound, the default before
# program admission), and the same scheduler with the bound relaxed by hand
# (10 s, or none), under the learned TTL or `forever`, with the caps at
# 0.5 / 0.25 or opened: "best in hindsight" must include them.
ISSUE12_DEFAULT = {"ADMISSION": "request", **CAPPED, **PRESSURE}
RELAXED: dict[str, dict[str, str]] = {
    "default-request": ISSUE12_DEFAULT,
    # Program admission under the learned TTL, capped (0.5 / 0.25): what
    # shipped until the caps opened.
    "default-capped": {**CAPPED, **PRESSURE},
    "forever-program": {"TTL_POLICY": "forever", **CAPPED},
    **{f"bound{label}-{ttl}": {**ISSUE12_DEFAULT, "MAX_QUEUE_DELAY_S": bound, "TTL_POLICY": ttl}
       for label, bound in (("10", "10"), ("inf", "100000")) for ttl in ("continuum", "forever")},
    "boundinf-forever-open-caps": {**ISSUE12_DEFAULT, "MAX_QUEUE_DELAY_S": "100000",
                                   "TTL_POLICY": "forever", **OPEN_CAPS},
    # Program admission with the caps opened and the one-shot bound kept (the
    # variant above drops it): measured as candidates, `default-open-caps`
    # shipped from then (docs/results/benchmarks-archive.md, "Opening the caps") until the pin
    # cost became `demand`; `default-pressure` is the same, named for that change.
    # `default-demand` shipped from then until `forever-program-open-caps` did.
    "default-open-caps": {**OPEN_CAPS, **PRESSURE},
    "default-pressure": {**OPEN_CAPS, **PRESSURE},
    "default-demand": {**OPEN_CAPS, **DEMAND},
    "forever-program-open-caps": {"TTL_POLICY": "forever", **OPEN_CAPS},
    # The turn bound (`max_turn_delay_s`) and aging (`max_turn_aging_s`) at other
    # values: `turn300-age120` is what ships (`turn120-age120` until issue 46's
    # cost was measured), `turn-off` both off.
    "turn30": {"MAX_TURN_DELAY_S": "30", "MAX_TURN_AGING_S": "30"},
    "turn-off": {"MAX_TURN_DELAY_S": "inf", "MAX_TURN_AGING_S": "inf"},
    "turn30-age-off": {"MAX_TURN_DELAY_S": "30", "MAX_TURN_AGING_S": "inf"},
    "turn30-age120": {"MAX_TURN_DELAY_S": "30", "MAX_TURN_AGING_S": "120"},
    "turn60-age120": {"MAX_TURN_DELAY_S": "60", "MAX_TURN_AGING_S": "120"},
    "turn120-age120": {"MAX_TURN_DELAY_S": "120", "MAX_TURN_AGING_S": "120"},
    "turn300-age120": {"MAX_TURN_DELAY_S": "300", "MAX_TURN_AGING_S": "120"},
}

# The slow-tool comparison: under what shipped when it ran (program
# admission, `forever`; `hazard` ships since), one TTL setting changed each:
# the `max-ttl-*` labels keep `forever`. `no-slow-by-name` never pins the slow tools
# of the slow-tool workloads (ci, approval, browse) and pins the rest until
# the cap; `eq2-program` is the paper's Eq. 2 at full cost; `oracle-program`
# knows each call's duration (oracle.py; uncapped, as the paper's), and
# `oracle-cap-program` pins only the calls that return within the cap
# (each for its duration); `hazard` is the tool-aware rule
# (core/hazard_ttl.py).
SLOW_TOOL_NAMES = ("ci", "approval", "browse")
SLOW_TOOLS: dict[str, dict[str, str]] = {
    "eq2-program": {"TTL_POLICY": "continuum", "PIN_COST": "always"},
    **{f"max-ttl-{t}": {"TTL_POLICY": "forever", "MAX_TTL_S": t} for t in ("10", "60", "300")},
    "no-slow-by-name": {"TTL_POLICY": "fixed", "DEFAULT_TTL_S": "100000",
                        "TOOL_TTL_S": json.dumps({t: 0 for t in SLOW_TOOL_NAMES})},
    "oracle-program": {"TTL_POLICY": "never"},
    "oracle-cap-program": {"TTL_POLICY": "never"},
    # Approvals (20-120 s) held for h seconds whatever happens, the rest as
    # `forever`: the rules that hold by elapsed time alone, between never (0)
    # and the cap (30).
    **{f"hold-approval-{h}": {"TTL_POLICY": "fixed", "DEFAULT_TTL_S": "100000",
                              "TOOL_TTL_S": json.dumps({"approval": int(h)})}
       for h in ("20", "25")},
    "forever-ttl": {"TTL_POLICY": "forever"},  # what shipped until `hazard` did
    "hazard": {"TTL_POLICY": "hazard"},
}

# `hazard` with one of its constants changed (HazardTTLPolicy's keyword ->
# value): the all-tools prior's pseudo-samples (3) and the price of a second
# of contested memory (0.02), the rows that chose them.
HAZARD_CONSTANTS: dict[str, dict[str, float]] = {
    "hazard-prior-1": {"prior_samples": 1.0},
    **{f"hazard-price-{c}": {"idle_cost": float(c)} for c in ("0.05", "0.1", "0.3", "1.0")},
}
SLOW_TOOLS |= {name: {"TTL_POLICY": "hazard"} for name in HAZARD_CONSTANTS}

# The order of programs in the regular lane (`program_order`, issue 48): by
# first arrival (what shipped until then), by attained service, and the
# oracle that knows each program's remaining work (oracle.py), each under
# what ships otherwise.
ORDERS: dict[str, dict[str, str]] = {
    "order-arrival": {"PROGRAM_ORDER": "arrival"},
    "order-service": {"PROGRAM_ORDER": "service"},
    "order-oracle": {"PROGRAM_ORDER": "arrival"},
}
# `order-service` in fewer levels (`program_service_levels`): 2 ranks only a
# program served nothing yet (its first turn) before the others, then by arrival.
ORDERS |= {f"order-service-{n}": {"PROGRAM_ORDER": "service", "PROGRAM_SERVICE_LEVELS": str(n)}
           for n in (2, 3, 4)}

# With a host tier (`NAME+offload-TIER`, issue 47): `keep-reloadable` is what
# ships but for `reloadable_pins_yield` (core/reloadable.py), off: under hold
# every pin is kept, whatever the host tier would serve back.
OFFLOAD_RULES: dict[str, dict[str, str]] = {
    "keep-reloadable": {"RELOADABLE_PINS_YIELD": "false"},
}

# Baseline label -> its TTL policy ("oracle*" get an oracle TTL policy, oracle.py).
BASELINES = {"continuum": "continuum", "fixed": "fixed", "forever": "forever",
             "oracle": "never", "oracle-hindsight": "never", "oracle-eq2": "never"}
# Every label that runs our scheduler: what ships ("default"), the baselines, the candidates.
PINNING = {"default": {}} | {
    name: {"TTL_POLICY": ttl, **PAPER} for name, ttl in BASELINES.items()
} | CANDIDATES | RELAXED | SLOW_TOOLS | ORDERS | OFFLOAD_RULES

# name -> (continuum scheduler?, CONTINUUM_* settings). A plain name runs under
# the configured pressure policy; NAME-yield / NAME-hold pick one.
POLICIES: dict[str, tuple[bool, dict[str, str]]] = {
    "stock": (False, {}),
    "never": (True, {"TTL_POLICY": "never", **PAPER}),
} | {
    label: (True, settings)
    for name, base in PINNING.items()
    for label, settings in pressure_variants(name, base, "PRESSURE_POLICY").items()
}


def sim_config(settings: dict[str, str]) -> ContinuumConfig:
    """A scheduler's config from CONTINUUM_*-style settings ({"TTL_POLICY": "never"},
    JSON for mappings and lists), independent of the process environment."""
    fields = {k.lower(): (json.loads(v) if v[:1] in "{[" else v) for k, v in settings.items()}
    return load_config(use_env=False, **fields)


def sim_model_dir(max_model_len: int) -> str:
    """A model directory for vLLM's ModelConfig: the tiny model's tokenizer and
    config, with a context window as long as the modelled model's (no weights
    are loaded by the scheduler)."""
    from vllm_continuum.tools.tiny_model import build_tiny_model

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
    worker: OffloadWorker | None = None  # the host tier's worker side (`NAME+offload`)


OFFLOAD = "+offload"


def split_offload(policy: str) -> tuple[str, HostTier | None]:
    """`NAME+offload[-TIER]`: policy NAME beside vLLM's KV offload to a host tier
    (host_tier.py: `3x`, `pcie4`, ...; bare: 1x the pool over PCIe 5); else (NAME, None)."""
    name, sep, suffix = policy.partition(OFFLOAD)
    if not sep:
        return policy, None
    return name, HostTier.parse(suffix.removeprefix("-"))


def build_scheduler(
    policy: str,
    cost: CostModel,
    clock: SimClock,
    *,
    prefill_profile_path: str | None = None,
    extra_settings: dict[str, str] | None = None,
    oracle_durations: Callable[[str], float | None] | None = None,
    oracle_remaining: Callable[[str, int], float] | None = None,
    stats: ContinuumStats | None = None,
) -> BuiltScheduler:
    """The scheduler `policy` runs on the simulated clock: the one place where
    the simulator hands a scheduler its settings, clock and TTL policy."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_continuum.adapter.scheduler import ContinuumScheduler

    name, tier = split_offload(policy)
    if name not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {sorted(POLICIES)}, "
                         f"each also as NAME{OFFLOAD}[-TIER]")
    is_continuum, base = POLICIES[name]
    settings = {**base, **(extra_settings or {})}
    if prefill_profile_path:
        settings.setdefault("PREFILL_PROFILE", prefill_profile_path)
    cls = ContinuumScheduler if is_continuum else Scheduler
    extra: dict[str, object] = {}
    if is_continuum:
        # No metrics export from a simulation: a stats object without a writer.
        extra = {"continuum_config": sim_config(settings), "continuum_clock": clock,
                 "continuum_stats": stats or ContinuumStats(writer=None)}
        constants = next((c for n, c in HAZARD_CONSTANTS.items() if name in (n, f"{n}-yield", f"{n}-hold")), None)
        if constants is not None:
            extra["continuum_ttl_policy"] = partial(HazardTTLPolicy.from_config, **constants)
        if name.startswith("order-oracle"):
            assert oracle_remaining is not None
            extra["continuum_program_order"] = remaining_work_order(oracle_remaining)
        if name.startswith("oracle"):
            assert oracle_durations is not None
            mode = next((m for m in ("eq2", "cap") if name.startswith(f"oracle-{m}")), "always")
            extra["continuum_ttl_policy"] = oracle_policy_factory(
                oracle_durations, cost, mode, prefill_profile_path)
    worker = None
    if tier is not None:
        # The fake KV cache as big as the modelled model's: the connector (and
        # what the scheduler reads of it) sees real sizes.
        extra["kv_bytes_per_token"] = int(cost.kv_bytes_per_block // cost.block_size)
        extra["kv_transfer_config"] = tier.kv_transfer_config(
            cost.num_gpu_blocks, cost.block_size, extra["kv_bytes_per_token"])
        worker = OffloadWorker(tier, cost.kv_bytes_per_block, cost.block_size)
    scheduler = new_scheduler(
        cls, sim_model_dir(cost.max_model_len), num_blocks=cost.num_gpu_blocks,
        block_size=cost.block_size, max_model_len=cost.max_model_len,
        max_num_seqs=cost.max_num_seqs, max_num_batched_tokens=cost.max_num_batched_tokens,
        **extra,
    )
    return BuiltScheduler(scheduler, policy, is_continuum, settings if is_continuum else {}, worker)
