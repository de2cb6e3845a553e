"""The waiting bound on a real server: a busy fleet of agent sessions pins and
cycles, and one large one-shot request (no session) needs most of the KV pool.

On today's main such a request could wait for as long as the agents kept
coming (program-level FCFS put every agent turn ahead of it, and held pins
kept its memory). With the bound it goes first once it has waited
`max_queue_delay_s`, pins give way to it, and it then waits only for the agent
turns already running to end. Both servers run the same traffic in the same
run; the figures are printed.
"""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest

from vllm_continuum.config import ContinuumConfig

pytestmark = pytest.mark.engine

AGENTS = 4
TURN_TOKENS = 24
PAUSE_S = 0.3
BIG_PROMPT = 800  # 50 of the 63 blocks
# The live server runs with the default waiting bound.
BOUND_S = ContinuumConfig.model_fields["max_queue_delay_s"].default


async def agent(client: httpx.AsyncClient, i: int, stop: asyncio.Event, latencies: list):
    rng = random.Random(i)
    history = [rng.randrange(300, 2000) for _ in range(280)]
    while not stop.is_set():
        start = time.monotonic()
        r = await client.post("/v1/completions", json={
            "model": "tiny", "prompt": history, "max_tokens": TURN_TOKENS, "ignore_eos": True,
            "session_id": f"fleet-{i}", "vllm_xargs": {"continuum_tool": "search"},
        })
        r.raise_for_status()
        latencies.append(time.monotonic() - start)
        await asyncio.sleep(PAUSE_S)  # the tool runs
        history = history + [rng.randrange(300, 2000) for _ in range(16)]


async def fleet_and_big_request(base_url: str) -> dict:
    latencies: list[float] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        agents = [asyncio.create_task(agent(client, i, stop, latencies)) for i in range(AGENTS)]
        await asyncio.sleep(4.0)  # the fleet is busy and pinning
        rng = random.Random(99)
        start = time.monotonic()
        r = await client.post("/v1/completions", json={
            "model": "tiny", "prompt": [rng.randrange(300, 2000) for _ in range(BIG_PROMPT)],
            "max_tokens": 1,
        })
        r.raise_for_status()
        big_s = time.monotonic() - start  # one token: time to first token
        stop.set()
        await asyncio.gather(*agents)
    return {"big_ttft_s": big_s, "agent_turn_max_s": max(latencies), "agent_turns": len(latencies)}


def test_a_large_one_shot_request_beside_a_busy_fleet_waits_within_the_bound(live_servers, capsys):
    results = {
        flavour: asyncio.run(fleet_and_big_request(server.base_url))
        for flavour, server in live_servers.items()
    }
    with capsys.disabled():
        print("\nlarge one-shot request beside 4 pinning agents:")
        for flavour, r in results.items():
            print(f"  {flavour:>9}: TTFT {r['big_ttft_s']:.2f} s, agents' longest turn "
                  f"{r['agent_turn_max_s']:.2f} s over {r['agent_turns']} turns")
        ratio = results["continuum"]["big_ttft_s"] / results["stock"]["big_ttft_s"]
        print(f"  continuum / stock TTFT: {ratio:.2f}x")
    cont, stock = results["continuum"], results["stock"]
    assert cont["agent_turns"] > AGENTS  # the fleet kept cycling
    # After BOUND_S it is first and pins give way: it waits for the agent turns
    # already running (one turn each, run side by side), then prefills as on stock.
    assert cont["big_ttft_s"] <= BOUND_S + 2 * cont["agent_turn_max_s"] + stock["big_ttft_s"] + 1.0
