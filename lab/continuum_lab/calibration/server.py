"""What a server says about its KV pool and scheduler limits, for the cost model.

A cost model needs the pool (num_gpu_blocks, block_size) and the limits the
scheduler batches by (max_num_seqs, max_num_batched_tokens, max_model_len).
They are read, in this order, from what the server exposes:

- `/server_info?config_format=json` (vLLM's dev endpoints, on with
  `VLLM_SERVER_DEV_MODE=1`): the whole config;
- `/metrics`, `vllm:cache_config_info`: num_gpu_blocks, block_size;
- `/v1/models`: max_model_len;

and what none of them gives comes from the command's flags, whose defaults
are vLLM's for its OpenAI server on a CPU (engine/arg_utils.py: 128
sequences, 2,048 batched tokens). Each field's source is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

FIELDS = ("num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len")
# vLLM's OpenAI-server defaults on a CPU (vllm/engine/arg_utils.py), for what no endpoint says.
CPU_DEFAULTS = {"max_num_seqs": 128, "max_num_batched_tokens": 2048}


@dataclass
class ServerShape:
    """The served model and FIELDS (each also readable as an attribute:
    shape.block_size), with where each value came from."""

    model: str  # the served name, which requests carry
    values: dict[str, int]
    sources: dict[str, str] = field(default_factory=dict)
    root: str = ""  # where the server loaded it from (/v1/models), for the provenance

    def __getattr__(self, name: str) -> int:
        if name in FIELDS:
            return self.values[name]
        raise AttributeError(name)


def _get(client: httpx.Client, path: str, **params) -> httpx.Response | None:
    """The endpoint's answer, or None where the server does not offer it (or fails)."""
    try:
        response = client.get(path, params=params)
    except httpx.HTTPError:
        return None
    return response if response.status_code == 200 else None


def _server_info(client: httpx.Client) -> dict[str, int]:
    response = _get(client, "/server_info", config_format="json")
    try:
        config = (response.json().get("vllm_config") or {}) if response else {}
    except (ValueError, AttributeError):  # not JSON, or not an object
        return {}
    if not isinstance(config, dict):
        return {}
    cache, sched, model = (config.get(k) or {} for k in ("cache_config", "scheduler_config",
                                                          "model_config"))
    found = {
        "num_gpu_blocks": cache.get("num_gpu_blocks"),
        "block_size": cache.get("block_size"),
        "max_num_seqs": sched.get("max_num_seqs"),
        "max_num_batched_tokens": sched.get("max_num_batched_tokens"),
        "max_model_len": model.get("max_model_len"),
    }
    return {k: int(v) for k, v in found.items() if isinstance(v, (int, float, str)) and str(v).isdigit()}


def _cache_config_info(client: httpx.Client) -> dict[str, int]:
    from prometheus_client.parser import text_string_to_metric_families

    response = _get(client, "/metrics")
    if response is None:
        return {}
    for family in text_string_to_metric_families(response.text):
        if family.name == "vllm:cache_config_info":
            for sample in family.samples:
                labels = sample.labels
                return {k: int(labels[k]) for k in ("num_gpu_blocks", "block_size")
                        if str(labels.get(k, "")).isdigit()}
    return {}


def _model_card(client: httpx.Client) -> dict:
    """The first model the server serves (`/v1/models`); without one, nothing to measure."""
    response = _get(client, "/v1/models")
    try:
        card = response.json()["data"][0] if response else {}
    except (ValueError, KeyError, IndexError, TypeError):  # not JSON, or no model listed
        return {}
    return card if isinstance(card, dict) else {}


def read_shape(base_url: str, flags: dict[str, int | None]) -> ServerShape:
    """The server's shape; `flags` (field -> value or None) fill what it does not
    say, and override nothing it does. Fails, saying which flag to pass, when a
    field has neither."""
    with httpx.Client(base_url=base_url.rstrip("/"), timeout=30) as client:
        card = _model_card(client)
        if not card.get("id"):
            raise SystemExit(f"no OpenAI-compatible server lists a model at {base_url}/v1/models: "
                             "start one and pass its --url, or let --bench-server LAYERS start the "
                             "CPU benchmark's")
        sources: list[tuple[str, dict[str, int]]] = [
            ("/server_info", _server_info(client)),
            ("/metrics vllm:cache_config_info", _cache_config_info(client)),
            ("/v1/models", {"max_model_len": int(card["max_model_len"])}
             if str(card.get("max_model_len", "")).isdigit() else {}),
        ]
    sources.append(("flag", {k: v for k, v in flags.items() if v is not None}))
    sources.append(("vLLM's CPU default (arg_utils.py)", CPU_DEFAULTS))
    values: dict[str, int] = {}
    origin: dict[str, str] = {}
    for name, found in sources:
        for key, value in found.items():
            if key in FIELDS and key not in values:
                values[key], origin[key] = value, name
    missing = [k for k in FIELDS if k not in values]
    if missing:
        flags_text = " ".join(f"--{k.replace('_', '-')} N" for k in missing)
        raise SystemExit(f"the server at {base_url} does not say its {', '.join(missing)}: "
                         f"pass {flags_text}")
    return ServerShape(str(card["id"]), values, origin, str(card.get("root") or card["id"]))
