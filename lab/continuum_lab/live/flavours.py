"""What `compare` can start: stock vLLM and continuum under each TTL and
pressure policy, with the CPU benchmark's defaults. Light (no HTTP client),
so the command line can offer the choices without importing the benchmark."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from continuum_lab.shipped_before import CAPPED, DEMAND, PRESSURE, pressure_variants


@dataclass(frozen=True)
class Flavour:
    name: str
    server: str  # "stock" or "continuum"
    settings: dict = field(default_factory=dict)  # --additional-config's continuum
    # vLLM's KV offload to host memory (its OffloadingConnector) through the
    # test host tier, continuum_lab/host_tier.py: what a GPU operator runs.
    host_tier: bool = False


# The flavour every other is set against, round by round; and the one the
# flavours with a host tier are also set against.
STOCK = "stock"
STOCK_OFFLOAD = "stock-offload"

# What `compare --flavours` accepts: stock, and each TTL policy under the
# configured pressure policy (plain name) or an explicit one (-yield, -hold).
FLAVOURS = {STOCK: Flavour(STOCK, "stock")} | {
    name: Flavour(name, "continuum", settings)
    for ttl in ("continuum", "fixed", "forever")
    for name, settings in pressure_variants(ttl, {"ttl_policy": ttl}, "pressure_policy").items()
} | {
    # Exactly what ships, whatever the defaults are (they change), and
    # what ships without its pins: the queue order and admission alone.
    "default": Flavour("default", "continuum", {}),
    "never": Flavour("never", "continuum", {"ttl_policy": "never"}),
    # Program admission under the learned TTL, capped (0.5 / 0.25): what
    # shipped until the caps opened.
    "default-capped": Flavour("default-capped", "continuum", CAPPED | PRESSURE),
    # What shipped from the caps' opening until the pin cost became `demand`.
    "default-pressure": Flavour("default-pressure", "continuum", PRESSURE),
    # What shipped from then until `forever` did: the learned TTL charged on demand.
    "default-demand": Flavour("default-demand", "continuum", DEMAND),
    # The shipped TTL policy in the paper's queue order: what `sessionless_first`
    # costs the agents and buys the one-shot requests, live (docs/results/benchmarks-archive.md).
    "continuum-program-fcfs": Flavour(
        "continuum-program-fcfs", "continuum", {"ttl_policy": "continuum", "queue_order": "program_fcfs"}),
    # The tool-aware retention rule (core/hazard_ttl.py): what ships since it
    # replaced `forever` (the `forever` flavour above).
    "hazard": Flavour("hazard", "continuum", {"ttl_policy": "hazard"}),
    # The order of programs (issue 48): by first arrival (the paper's), by
    # attained service in 8 levels, and a program's first turn before other
    # programs' remaining turns (2 levels).
    "order-arrival": Flavour("order-arrival", "continuum", {"program_order": "arrival"}),
    "order-service": Flavour("order-service", "continuum", {"program_order": "service"}),
    "order-service-2": Flavour("order-service-2", "continuum",
                               {"program_order": "service", "program_service_levels": 2}),
    # Stock vLLM and what ships, each with vLLM's KV offload to host memory:
    # an evicted prefix comes back by a load from the host tier, not a prefill.
    STOCK_OFFLOAD: Flavour(STOCK_OFFLOAD, "stock", host_tier=True),
    "default-offload": Flavour("default-offload", "continuum", {}, host_tier=True),
    # Our queue order and admission with vLLM's offload, no pins: what the
    # admission alone does when an evicted prefix reloads from host memory.
    "never-offload": Flavour("never-offload", "continuum", {"ttl_policy": "never"}, host_tier=True),
}

# The host tier's capacity, as a multiple of the KV pool (`compare --host-tier-x`).
DEFAULT_HOST_TIER_X = 3.0
HOST_TIER_SPEC = {"spec_name": "TorchCopyOffloadingSpec", "spec_module_path": "continuum_lab.host_tier"}


def host_tier_setup(flavours, host_tier_x: float, num_blocks: int, num_layers: int,
                    block_size: int) -> dict:
    """The host tier of these flavours' servers ({} if none has one): its
    blocks (`host_tier_x` times the pool's), the flavours, the server flags."""
    from continuum_lab.live.bench_model import kv_bytes_per_block

    named = [f for f in flavours if FLAVOURS[f].host_tier]
    if not named:
        return {}
    blocks = math.ceil(host_tier_x * num_blocks)
    size = blocks * kv_bytes_per_block(num_layers, block_size)
    return {"x_pool": host_tier_x, "blocks": blocks, "flavours": named,
            "args": host_tier_args(size, block_size)}


def host_tier_args(cpu_bytes: int, block_size: int) -> list[str]:
    """The flags an operator passes for vLLM's KV offload to host memory
    (`--kv-transfer-config` naming its OffloadingConnector; `cpu_bytes_to_use`
    is the host tier's size, `block_size` the tokens of an offloaded chunk),
    with the test host tier's spec, which runs on the CPU build
    (continuum_lab/host_tier.py). On a GPU, drop the spec's two keys."""
    config = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"cpu_bytes_to_use": int(cpu_bytes),
                                            "block_size": block_size, **HOST_TIER_SPEC}}
    return ["--kv-transfer-config", json.dumps(config)]


# The CPU benchmark's defaults (docs/results/benchmarks-archive.md explains the choice).
DEFAULT_WORKLOAD = "cpu-agent"
DEFAULT_LAYERS = 2
DEFAULT_NUM_BLOCKS = 160  # x 32 tokens: a 5,120-token pool
DEFAULT_MAX_MODEL_LEN = 4096
# How long a benchmark server may take to start: about a minute on an idle
# two-core machine, several when other jobs share the cores.
START_TIMEOUT_S = 600
# Every continuum server: the TTL model trusts tool CDFs after 20 samples (K;
# the default 100 is more tool calls than a CPU run makes, which would leave it
# in cold start throughout). Runs before the caps opened also set
# max_session_pinned_fraction 0.4 here (each run's results.json records these).
COMMON_CONTINUUM_SETTINGS = {
    "cold_start_samples": 20,
}


def model_threads(cpus: int | None = None) -> int:
    """The benchmark server's model worker threads, by default every core but one.

    vLLM's engine core waits for each step's output by spinning on its shared-
    memory queue (shm_broadcast.py: `sched_yield` for a second after each read),
    so it keeps a core busy while the model runs. A worker with a thread on
    every core loses one of them to it mid-step, and its steps ran 1.4-1.5x
    what the same server measured when idle (docs/results/benchmarks-archive.md, "One core for
    the engine core"). On a GPU server the model runs on the GPU and the
    engine core has a CPU to itself; leaving it a core is this benchmark's
    nearest equivalent, and makes calibrate's probes time what a replay runs."""
    return max(1, (cpus or os.cpu_count() or 1) - 1)


def bench_server_env(threads: int | None = None) -> dict[str, str]:
    """The environment every benchmark server starts with (compare's, calibrate
    --bench-server's): its model worker's threads (default: model_threads())."""
    return {"OMP_NUM_THREADS": str(threads or model_threads())}


def model_threads_arg(parser) -> None:
    """`--model-threads`, for compare and calibrate --bench-server alike."""
    from continuum_lab.cli import positive_int

    parser.add_argument("--model-threads", type=positive_int, default=model_threads(),
                        help="threads of the benchmark server's model worker (default: every core "
                             f"but one, {model_threads()} here: the engine core spins on the "
                             "other; docs/calibration.md)")


def continuum_settings_arg(text: str) -> dict:
    """`--continuum-settings`: a JSON object of continuum settings (config.py's
    fields), checked here so that a typo fails before any server starts."""
    import argparse
    import json

    from vllm_continuum.config import ConfigError, load_config

    try:
        settings = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"not JSON ({exc}); give an object, e.g. '{{\"pin_cost\": \"pressure\"}}'") from exc
    if not isinstance(settings, dict):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a JSON object; give one, e.g. '{{\"pin_cost\": \"pressure\"}}'")
    try:
        load_config(use_env=False, **settings)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"invalid continuum settings: {exc}") from exc
    return settings
