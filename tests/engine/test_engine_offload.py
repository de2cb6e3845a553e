"""The pause scenario against what GPU operators run: vLLM's KV offload to
host memory (its `OffloadingConnector`, with the test host tier of
continuum_lab/host_tier.py, which runs on the CPU build), live on the tiny
model. Four servers side by side: stock and continuum (the session's
`live_servers`), stock + offload and continuum + offload (started here,
same model, flags and KV pool, plus the operator's `--kv-transfer-config`).

Where turn 2's cached tokens came from is read from vLLM's own counters
(`vllm:prompt_tokens_by_source`: the GPU prefix cache, where a pin's blocks
are found, or the KV connector's host tier) and continuum's (a resume that
found its pin), beside the usage's `cached_tokens` the client sees.
"""

from __future__ import annotations

import random
import re
import time

import httpx
import pytest
from openai import OpenAI

from continuum_lab.live.flavours import host_tier_args
from continuum_lab.live.server_counters import cache_counters, continuum_counters, counter_delta
from tests.conftest import serving
from vllm_continuum.core.hints import LAST_TURN_KEY, TOOL_KEY, TTL_KEY
from vllm_continuum.demos.pause_demo import DEMO_SETTINGS
from vllm_continuum.demos.pause_scenario import cached_tokens, churn, run_pause_scenario
from vllm_continuum.metrics.names import PINNED_BLOCKS, PINNED_SESSIONS
from vllm_continuum.metrics.snapshot import EXPIRY_GRACE_S
from vllm_continuum.tools.local_server import BLOCK_SIZE, flavour_server

pytestmark = pytest.mark.engine

# A host tier of 512 blocks (64 KiB each on the tiny model): turn 1 and all the
# churn of a scenario fit, so nothing a turn needs is dropped from it.
HOST_TIER_BYTES = 32 << 20
PROMPT_TOKENS, RESULT_TOKENS, OUTPUT_TOKENS, VOCAB = 1000, 64, 16, 2000
FULL_BLOCKS = PROMPT_TOKENS // BLOCK_SIZE * BLOCK_SIZE  # 992: what a resumed turn can reuse
LOGPROB_NOISE = 1e-5  # recomputed vs loaded KV, float32: 5e-7 measured


@pytest.fixture(scope="module")
def servers(live_servers, tiny_model_dir, tmp_path_factory):
    """The session's stock and continuum servers, and the same two with KV offload."""
    log_dir = tmp_path_factory.mktemp("offload-server-logs")
    offload = {}
    for flavour in ("stock", "continuum"):
        server = flavour_server(flavour, tiny_model_dir, log_dir,
                                settings={**DEMO_SETTINGS, "log_level": "DEBUG"},
                                extra_args=host_tier_args(HOST_TIER_BYTES, BLOCK_SIZE))
        server.name = f"{flavour}-offload"
        server.log_path = log_dir / f"{server.name}.log"
        offload[server.name] = server
    with serving(offload):
        yield {**live_servers, **offload}


def settled(read, *, tries: int = 60, pause_s: float = 0.15):
    """A server's counters once two reads agree (its last step's stats and the
    engine's idle snapshot reach /metrics a moment after the response)."""
    last = read()
    for _ in range(tries):
        time.sleep(pause_s)
        now = read()
        if now == last:
            return now
        last = now
    return last


def gauge(url: str, name: str) -> float | None:
    """A continuum gauge from the server's /metrics (None on stock)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    return float(found[0]) if found else None


def quiesce(url: str) -> None:
    """Wait out pins that earlier tests left on a shared server (their TTL passes
    with no traffic; /metrics shows their expiry then), so that the counters'
    differences are ours alone."""
    deadline = time.monotonic() + float(DEMO_SETTINGS["default_ttl_s"]) + EXPIRY_GRACE_S + 15
    while gauge(url, PINNED_SESSIONS):
        assert time.monotonic() < deadline, f"pins on {url} never expired"
        time.sleep(0.5)


def counters(url: str) -> dict:
    return settled(lambda: {**cache_counters(url), **_continuum(url)})


def _continuum(url: str) -> dict:
    c = continuum_counters(url)
    return {f"resumes:{k}": float(v) for k, v in c.get("resumes", {}).items()} | {
        f"releases:{k}": float(v) for k, v in c.get("releases", {}).items()}


def hinted_pause(url: str, label: str, *, ttl_s: float | None = None, seed: int = 7) -> dict:
    """A session's turn 1 (1,000 token ids, ending in a call of `get_weather`,
    said by the continuum hint), other traffic through the pool, and turn 2
    (turn 1's prompt and a tool result, its last turn), both greedy. `ttl_s`:
    the pin's TTL hint, waited out before the other traffic runs (whose first
    request expires the pin, so that the traffic evicts its blocks).
    Returns turn 2's usage, both turns' text and turn 2's counters."""
    client = OpenAI(base_url=f"{url}/v1", api_key="-", timeout=120, max_retries=0)
    rng = random.Random(seed)
    prompt = [rng.randrange(300, VOCAB - 300) for _ in range(PROMPT_TOKENS)]
    result = [rng.randrange(300, VOCAB - 300) for _ in range(RESULT_TOKENS)]
    session = f"offload-{label}-{seed}-{ttl_s}"
    hints = {TOOL_KEY: "get_weather"} | ({} if ttl_s is None else {TTL_KEY: ttl_s})
    greedy = {"model": "tiny", "max_tokens": OUTPUT_TOKENS, "temperature": 0, "logprobs": 1}
    quiesce(url)
    start = counters(url)
    t1 = client.completions.create(prompt=prompt, **greedy,
                                   extra_body={"session_id": session, "vllm_xargs": hints})
    time.sleep(0 if ttl_s is None else ttl_s + 0.3)
    churn(client, requests=4, tokens=800, vocab=VOCAB, seed=seed + 1)
    before = counters(url)
    t2 = client.completions.create(prompt=prompt + result, **greedy,
                                   extra_body={"session_id": session,
                                               "vllm_xargs": {LAST_TURN_KEY: 1}})
    end = counters(url)
    pins = {k: v for k, v in counter_delta(start, end).items() if k.startswith(("resumes:", "releases:"))}
    return {"cached": cached_tokens(t2.usage), "turn1": t1.choices[0].text,
            "turn2": t2.choices[0].text, "logprobs": t2.choices[0].logprobs.token_logprobs,
            **counter_delta(before, end), **pins}


def test_pause_scenario_by_the_tier_that_served_turn_2(servers):
    """The project's pause scenario (vllm_continuum/demos/pause_scenario.py, unchanged)
    with KV offload (without it: test_engine_pause.py, on the same stock and
    continuum servers): stock + offload loads turn 1's prompt back from the host
    tier; continuum + offload finds it pinned on the GPU, and loads nothing."""
    results, sources = {}, {}
    for name in ("stock-offload", "continuum-offload"):
        server = servers[name]
        before = counters(server.base_url)
        results[name] = run_pause_scenario(server.base_url, f"offload-{name}", seed=3)
        sources[name] = counter_delta(before, counters(server.base_url))
    table = {n: (r.turn2_cached_tokens, sources[n]["host_tier"], sources[n].get("resumes:pinned", 0))
             for n, r in results.items()}
    full = {n: r.turn1_full_block_tokens for n, r in results.items()}
    assert len(set(full.values())) == 1 and full["stock-offload"] >= 10 * BLOCK_SIZE, full
    # Turn 1 and the other traffic are new to the fresh offload servers: every
    # token their host tier served over the scenario is turn 2's.
    assert table["stock-offload"][0] == table["stock-offload"][1] >= full["stock-offload"], table
    cached, host, pinned = table["continuum-offload"]
    assert cached >= full["continuum-offload"] and host == 0 and pinned == 1, table
    assert sources["continuum-offload"]["load_bytes"] == 0, sources
    assert sources["stock-offload"]["load_bytes"] > 0 and sources["stock-offload"]["store_bytes"] > 0


@pytest.mark.parametrize("case", ["pin alive", "pin expired"])
def test_continuum_with_offload_resumes_from_the_pin_or_the_host_tier(servers, case):
    """Greedy turns on every server: turn 2 reuses every full block of turn 1's
    prompt from the pin (continuum, and continuum + offload while the pin
    lives), from the host tier (stock + offload, and continuum + offload once
    the pin expired before the other traffic), or recomputes it (stock); and
    every server writes the same text with the same log-probabilities,
    whichever tier the KV came from."""
    ttl, seed = (None, 7) if case == "pin alive" else (0.2, 11)  # new prompts each case
    runs = {name: hinted_pause(s.base_url, name, ttl_s=ttl, seed=seed)
            for name, s in servers.items()}
    by_source = {n: (r["cached"], r["gpu_cache"], r["host_tier"]) for n, r in runs.items()}
    # vLLM's hit counters, counted as its prefix caches are queried, say the same.
    assert {n: (r["prefix_cache_hits"], r["external_prefix_cache_hits"]) for n, r in runs.items()} == {
        n: (gpu, host) for n, (_, gpu, host) in by_source.items()}
    assert by_source["stock"] == (0, 0, 0), by_source
    assert by_source["stock-offload"] == (FULL_BLOCKS, 0, FULL_BLOCKS), by_source
    assert runs["stock-offload"]["load_bytes"] > 0
    offload = runs["continuum-offload"]
    if case == "pin alive":
        for name in ("continuum", "continuum-offload"):
            assert by_source[name] == (FULL_BLOCKS, FULL_BLOCKS, 0), by_source
            assert runs[name]["resumes:pinned"] == 1 and runs[name]["releases:resumed"] == 1
        assert offload["load_bytes"] == 0
    else:
        assert by_source["continuum"][0] == 0, by_source  # no pin, no host tier: recomputed
        assert by_source["continuum-offload"] == (FULL_BLOCKS, 0, FULL_BLOCKS), by_source
        assert offload.get("resumes:pinned", 0) == 0 and offload["load_bytes"] > 0
        for name in ("continuum", "continuum-offload"):
            assert runs[name]["releases:expired"] == 1, runs[name]
    texts = {(r["turn1"], r["turn2"]) for r in runs.values()}
    assert len(texts) == 1, {n: (r["turn1"], r["turn2"]) for n, r in runs.items()}
    # The random model's text is not enough: its greedy tokens survive one block
    # of wrong KV. Its log-probabilities do not (one loaded block zeroed moved
    # them by 9e-3, every load read a chunk off by 1.7e-4; float noise 5e-7).
    for name, r in runs.items():
        moved = max(abs(a - b) for a, b in zip(r["logprobs"], runs["stock"]["logprobs"]))
        assert moved < LOGPROB_NOISE, (name, moved)


def test_no_pin_left_and_no_error(servers):
    """After the scenarios (each session ended with its last turn): no block is
    pinned on the continuum server with offload, and neither offload server
    logged an error (the session's servers serve other tests' bad requests too)."""
    assert gauge(servers["continuum-offload"].base_url, PINNED_BLOCKS) == 0
    for name in ("stock-offload", "continuum-offload"):
        log = servers[name].log_path.read_text(errors="replace")
        assert "Traceback" not in log and " ERROR " not in log, servers[name].log_tail(60)
        assert "test host tier (torch copies, synchronous): 512 chunks" in log, name
