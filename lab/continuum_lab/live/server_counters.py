"""What a server says it did during a replay, from its `/metrics`.

Without client hints the server must read each tool call from the output
itself; its own counters show whether it did: how many finished tool-call
turns it decided a TTL for (the TTL histogram's count, by tool), how many of
those it pinned, and how the resumed turns found their session (pinned or
not). `compare` scrapes them when a continuum flavour's replay ends, before
the server stops, and prints them beside the client's figures.

One of vLLM's own counters is read from every server, stock's too: its
preemptions. A request preempted under pool pressure is prefilled again,
which the client's usage (prompt minus cached tokens) never shows, so
`predict` sets the live count beside the simulator's.

And where every server's cached prompt tokens came from, by vLLM's own
counters (`cache_counters`): its GPU prefix cache (a continuum pin's blocks
are found there too), the KV connector's host tier (KV offload), or
computed; and the bytes and seconds the host tier's loads and stores took.
"""

from __future__ import annotations

from collections import Counter

import httpx

from vllm_continuum.metrics.names import PIN_RELEASES, PINS, RELOADABLE_PINS, RESUMES, TTL_SECONDS

VLLM_PREEMPTIONS = "vllm:num_preemptions"  # vLLM's counter (v1/metrics/loggers.py)
# vLLM's prompt tokens by where their KV came from (v1/metrics/stats.py's
# PromptTokenStats: computed + local cache + external = the prompt), and its KV
# offload's transfers (kv_connector/v1/offloading/metrics.py), each as
# cache_counters names it.
VLLM_PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source"
PROMPT_SOURCES = {"local_compute": "computed", "local_cache_hit": "gpu_cache",
                  "external_kv_transfer": "host_tier"}
VLLM_OFFLOAD = {"vllm:kv_offload_load_bytes": "load_bytes", "vllm:kv_offload_load_time": "load_s",
                "vllm:kv_offload_store_bytes": "store_bytes", "vllm:kv_offload_store_time": "store_s",
                # The prefix caches' hits in tokens, counted as the scheduler queries them.
                "vllm:prefix_cache_hits": "prefix_cache_hits",
                "vllm:external_prefix_cache_hits": "external_prefix_cache_hits"}


def _samples(base_url: str, timeout_s: float):
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout_s)
    response.raise_for_status()
    for family in text_string_to_metric_families(response.text):
        yield from family.samples


def engine_preemptions(base_url: str, timeout_s: float = 10.0) -> int | None:
    """vLLM's preemptions so far, over its engines (a difference of two reads is a
    replay's); None from a server that does not export the counter."""
    counts = [s.value for s in _samples(base_url, timeout_s) if s.name == f"{VLLM_PREEMPTIONS}_total"]
    return int(sum(counts)) if counts else None


def cache_counters(base_url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """vLLM's totals so far: prompt tokens `computed`, found in the GPU prefix
    cache (`gpu_cache`) or loaded by the KV connector (`host_tier`); the
    host tier's `load_bytes`, `load_s`, `store_bytes`, `store_s` (0 without
    KV offload); and the hits vLLM counts as its prefix caches are queried
    (`prefix_cache_hits`, `external_prefix_cache_hits`). A replay's are the
    difference of two reads (`counter_delta`)."""
    totals = dict.fromkeys([*PROMPT_SOURCES.values(), *VLLM_OFFLOAD.values()], 0.0)
    for sample in _samples(base_url, timeout_s):
        if sample.name == f"{VLLM_PROMPT_TOKENS_BY_SOURCE}_total":
            key = PROMPT_SOURCES.get(sample.labels.get("source", ""))
        else:
            key = VLLM_OFFLOAD.get(sample.name.removesuffix("_total"))
        if key is not None and sample.name.endswith("_total"):
            totals[key] += sample.value
    return totals


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before.get(key, 0.0) for key in after}


def cache_line(label: str, delta: dict[str, float]) -> str:
    """Where a replay's prompt tokens came from, and what the host tier moved."""
    prompt = sum(delta[k] for k in PROMPT_SOURCES.values()) or 1.0
    line = (f"{label}: prompt tokens {prompt:,.0f}: computed {delta['computed']:,.0f} "
            f"({delta['computed'] / prompt:.1%}), GPU prefix cache (pins included) "
            f"{delta['gpu_cache']:,.0f} ({delta['gpu_cache'] / prompt:.1%}), host tier "
            f"{delta['host_tier']:,.0f} ({delta['host_tier'] / prompt:.1%})")
    if delta["load_bytes"] or delta["store_bytes"]:
        line += (f"; host tier loaded {delta['load_bytes'] / 2**20:,.0f} MiB in "
                 f"{delta['load_s']:.2f} s, stored {delta['store_bytes'] / 2**20:,.0f} MiB in "
                 f"{delta['store_s']:.2f} s")
    return line


def continuum_counters(base_url: str, timeout_s: float = 10.0) -> dict:
    """The server's totals: tool calls read (by tool), pins (and of those, the
    pins made reloadable: they give way as a host tier would serve them back),
    resumes by outcome, pin releases by reason. Empty on a server without
    continuum's metrics."""
    calls: Counter[str] = Counter()
    resumes: Counter[str] = Counter()
    releases: Counter[str] = Counter()
    pins = reloadable = 0.0
    for sample in _samples(base_url, timeout_s):
        if sample.name == f"{TTL_SECONDS}_count":
            calls[sample.labels.get("tool", "")] += sample.value
        elif sample.name == f"{PINS}_total":
            pins += sample.value
        elif sample.name == f"{RELOADABLE_PINS}_total":
            reloadable += sample.value
        elif sample.name == f"{RESUMES}_total":
            resumes[sample.labels.get("outcome", "")] += sample.value
        elif sample.name == f"{PIN_RELEASES}_total":
            releases[sample.labels.get("reason", "")] += sample.value
    if not calls and not pins and not resumes:
        return {}
    return {"tool_calls_read": _as_ints(calls), "pins": int(pins),
            "reloadable_pins": int(reloadable), "resumes": _as_ints(resumes),
            "releases": _as_ints(releases)}


def _as_ints(counts: Counter[str]) -> dict[str, int]:
    return {key: int(n) for key, n in sorted(counts.items()) if n}


def counters_line(label: str, counters: dict) -> str:
    calls = counters["tool_calls_read"]
    by_tool = ", ".join(f"{tool} {n}" for tool, n in calls.items())
    resumes = ", ".join(f"{k} {n}" for k, n in counters["resumes"].items()) or "none"
    releases = ", ".join(f"{k} {n}" for k, n in counters["releases"].items()) or "none"
    return (f"{label} server: read {sum(calls.values())} tool calls ({by_tool or 'none'}), "
            f"pinned {counters['pins']} ({counters['reloadable_pins']} reloadable); "
            f"resumed turns: {resumes}; pin releases: {releases}")
