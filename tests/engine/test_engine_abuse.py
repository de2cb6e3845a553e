"""Untrusted clients against a live continuum server: fuzzed hints and session
ids, then a soak with random disconnects and early session ends.

Sizes scale with CONTINUUM_SOAK_SESSIONS (default 200 sessions x 5 turns)
and CONTINUUM_FUZZ_REQUESTS (default 1000); the longer variant in the README
raises them.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_continuum.core.hints import parse_hints
from vllm_continuum.tools.local_server import flavour_server

pytestmark = pytest.mark.engine

TTL_S = 2.0
MAX_TTL_S = 4.0
FUZZ_REQUESTS = int(os.environ.get("CONTINUUM_FUZZ_REQUESTS", "1000"))
SOAK_SESSIONS = int(os.environ.get("CONTINUUM_SOAK_SESSIONS", "200"))
SOAK_TURNS = 5


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    settings = {"ttl_policy": "fixed", "default_ttl_s": TTL_S, "max_ttl_s": MAX_TTL_S}
    with flavour_server("continuum", tiny_model_dir, tmp_path_factory.mktemp("abuse"),
                        settings=settings, num_blocks=129) as s:
        yield s


def scrape(base_url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model_name"))
            samples[(sample.name, labels)] = sample.value
    return samples


def metric(samples, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return samples.get(key, 0.0)


# ----------------------------------------------------------------- fuzzing
WEIRD = [
    float("nan"), float("inf"), -float("inf"), -1, -1e308, 1e308, 0, 1e9, 3.5, "3.5", "",
    "x" * 100_000, "🙂" * 50, "\u0000\u202e", [1, 2], [], True, False, None, {"a": 1}, 2**70,
]


def fuzz_body(rng: random.Random) -> str:
    xargs = {}
    for key in ("continuum_ttl_s", "continuum_tool", "continuum_last_turn",
                "continuum_unknown", "session_id"):
        if rng.random() < 0.5:
            xargs[key] = rng.choice(WEIRD + ["search", 1, 2.0])
    body = {
        "model": "tiny",
        "prompt": [rng.randrange(300, 2000) for _ in range(rng.randint(1, 80))],
        "max_tokens": 2,
        "vllm_xargs": xargs,
    }
    if rng.random() < 0.7:
        body["session_id"] = rng.choice(
            ["s1", "s2", "", "x" * rng.randint(1, 5000), "🙂会话", "\t\n", str(rng.random())])
    return json.dumps(body, allow_nan=True)  # NaN/Infinity literals on purpose


async def _fuzz(base_url: str, n: int):
    rng = random.Random(7)
    bodies = [fuzz_body(rng) for _ in range(n)]
    results: list[tuple[str, int, str]] = []
    sem = asyncio.Semaphore(8)
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        async def one(body):
            async with sem:
                r = await client.post("/v1/completions", content=body,
                                      headers={"content-type": "application/json"})
                results.append((body, r.status_code, r.text[:300]))
        await asyncio.gather(*(one(b) for b in bodies))
    return results


def expected_invalid(body: str) -> int:
    """Invalid hints in what the engine receives: vLLM's own request model
    validates (and coerces, e.g. true -> 1) `vllm_xargs` first."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    xargs = CompletionRequest.model_validate_json(body).vllm_xargs or {}
    return len(parse_hints(xargs, 128).invalid)


def test_fuzzed_hints_are_answered_and_counted(server):
    before = scrape(server.base_url)
    results = asyncio.run(_fuzz(server.base_url, FUZZ_REQUESTS))
    statuses = {}
    for _, status, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    print("fuzz statuses:", statuses)
    assert len(results) == FUZZ_REQUESTS
    for _, status, text in results:
        assert status == 200 or 400 <= status < 500, (status, text)
        if status != 200:
            assert text, "a 4xx must say what is wrong"
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    accepted = [b for b, status, _ in results if status == 200]
    assert len(accepted) > FUZZ_REQUESTS // 4, statuses
    counted = metric(scrape(server.base_url), "continuum_invalid_hints_total") - metric(
        before, "continuum_invalid_hints_total")
    assert counted == sum(expected_invalid(b) for b in accepted) > 0
    assert "Traceback" not in server.log_path.read_text()


# -------------------------------------------------------------------- soak
async def _session(client: httpx.AsyncClient, sid: int, rng: random.Random, tally: dict):
    history = [rng.randrange(300, 2000) for _ in range(rng.randint(40, 200))]
    turns = SOAK_TURNS if rng.random() > 0.2 else rng.randint(1, SOAK_TURNS - 1)  # early ends
    for turn in range(turns):
        last = turn == turns - 1
        disconnect = rng.random() < 0.1
        body = {
            "model": "tiny", "prompt": history, "max_tokens": 6, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True},
            "session_id": f"soak-{sid}",
            "vllm_xargs": {"continuum_last_turn": 1} if last else {"continuum_tool": "tool"},
        }
        tokens = 0
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    if disconnect:
                        break  # the client goes away mid-stream
                    usage = json.loads(line[6:]).get("usage")
                    if usage:
                        tokens = usage["completion_tokens"]
        if disconnect:
            tally["cut"] += 1
            return
        assert tokens == 6, f"session {sid} turn {turn}: {tokens} tokens"
        history += [rng.randrange(300, 2000) for _ in range(6 + rng.randint(5, 40))]
        await asyncio.sleep(rng.uniform(0, 0.3))  # the tool runs
    tally["finished"] += 1


async def _soak(base_url: str):
    rng = random.Random(11)
    tally = {"cut": 0, "finished": 0}
    sem = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        async def run(sid):
            async with sem:
                await _session(client, sid, random.Random(rng.random()), tally)
        await asyncio.gather(*(run(i) for i in range(SOAK_SESSIONS)))
    return tally


def test_soak_with_disconnects_ends_with_nothing_pinned(server):
    started = time.monotonic()
    tally = asyncio.run(_soak(server.base_url))
    print(f"soak: {tally} in {time.monotonic() - started:.0f} s")
    assert tally["cut"] + tally["finished"] == SOAK_SESSIONS
    assert tally["finished"] > SOAK_SESSIONS // 2
    time.sleep(MAX_TTL_S + 1)  # every pin's TTL has passed, with no traffic
    idle = scrape(server.base_url)
    assert metric(idle, "continuum_pinned_blocks") == 0
    assert metric(idle, "continuum_pinned_sessions") == 0
    # vLLM's own gauge is refreshed only by engine steps: one request makes it
    # report the pool as the scheduler now holds it (pins expire lazily first).
    httpx.post(f"{server.base_url}/v1/completions",
               json={"model": "tiny", "prompt": [301], "max_tokens": 1}, timeout=60)
    after = scrape(server.base_url)
    assert math.isclose(metric(after, "vllm:kv_cache_usage_perc"), 0.0, abs_tol=1e-9)
    assert "Traceback" not in server.log_path.read_text()
