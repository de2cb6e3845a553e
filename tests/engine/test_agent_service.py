"""The agent HTTP service over real HTTP, its loop on a real vLLM server:
session lifecycle, the blocking and the streamed (SSE) turn, a turn already
running (409), and a client that hangs up mid-stream (the turn still lands).
The 4xx paths that need no model are in test_agent_units.py."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Literal

import httpx
import pytest
from openai import AsyncOpenAI

from vllm_continuum.agent import AgentLoop, LoopConfig
from vllm_continuum.agent.demo_tools import DemoToolConfig, demo_registry
from vllm_continuum.agent.runner import ServiceThread
from vllm_continuum.agent.service import AgentService, create_app

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def http(live_servers):
    server = live_servers["continuum"]
    registry = demo_registry(DemoToolConfig(weather_median_s=0.05, hotel_latency_s=0.05,
                                            hotel_failure_rate=1.0, seed=2))

    @registry.tool(timeout_s=30)
    async def survey(city: Literal["Paris", "Tokyo"]) -> str:
        """A slow survey of a city."""
        await asyncio.sleep(2.5)
        return f"{city} surveyed"

    client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=120,
                         max_retries=0)
    loop = AgentLoop(client, registry, LoopConfig(model="tiny", max_steps=4, max_tokens=64,
                                                  parallel_tool_calls=False, temperature=0.7))
    with ServiceThread(create_app(AgentService(loop))) as thread:
        with httpx.Client(base_url=thread.base_url, timeout=120) as c:
            yield c


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def sse_events(response: httpx.Response):
    event, data = None, []
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[len("event: "):]
        elif line.startswith("data: "):
            data.append(line[len("data: "):])
        elif line == "" and event is not None:
            yield event, json.loads("\n".join(data))
            event, data = None, []


def wait_idle(http: httpx.Client, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while http.get("/health").json()["turns_running"]:
        assert time.monotonic() < deadline, "a turn never finished"
        time.sleep(0.2)


def test_session_lifecycle_blocking_and_streamed(http):
    r = http.post("/sessions", json={"system": "You are a travel agent.",
                                     "tools": ["calculator", "get_weather", "book_hotel"]})
    assert r.status_code == 201, r.text
    session = r.json()
    sid = session["id"]
    assert session["tools"] == ["calculator", "get_weather", "book_hotel"]
    assert session["messages"] == [{"role": "system", "content": "You are a travel agent."}]

    # Blocking turn: a failing tool does not fail the turn.
    r = http.post(f"/sessions/{sid}/messages", json={
        "content": "Book a hotel.", "tool_choice": [named("book_hotel"), "none"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["session_id"] == sid and body["finish_reason"] == "answer"
    assert isinstance(body["answer"], str)
    trace = body["trace"]
    assert [c["step"] for c in trace["model_calls"]] == [0, 1]
    assert trace["model_calls"][0]["ttft_s"] > 0
    assert trace["model_calls"][1]["cached_tokens"] >= 32
    assert [(t["name"], t["outcome"]) for t in trace["tool_calls"]] == [("book_hotel", "error")]
    assert "unavailable" in trace["tool_calls"][0]["error"]

    history = http.get(f"/sessions/{sid}/messages").json()["messages"]
    assert [m["role"] for m in history] == ["system", "user", "assistant", "tool", "assistant"]
    assert json.loads(history[3]["content"])["error"] == "error"

    # Streamed turn: an event per model call, tool result and step, then the result.
    with http.stream("POST", f"/sessions/{sid}/messages", json={
        "content": "And the weather?", "tool_choice": ["required", "required", "none"],
        "stream": True,
    }) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r))
    kinds = [kind for kind, _ in events]
    assert kinds == ["model_call", "tool_result", "step", "model_call", "tool_result", "step",
                     "model_call", "final"]
    first = events[0][1]
    assert first["tool_calls"][0]["function"]["name"] in ("calculator", "get_weather",
                                                          "book_hotel")
    assert events[1][1]["trace"]["call_id"] == first["tool_calls"][0]["id"]
    final = events[-1][1]
    assert final["finish_reason"] == "answer" and final["trace"]["turn"] == 1
    assert [c["pin_resumed"] for c in final["trace"]["model_calls"]] == [None, True, True]

    full = http.get(f"/sessions/{sid}").json()
    assert full["turns"] == 2 and len(full["traces"]) == 2
    assert len(full["messages"]) == 5 + 6
    assert full["messages"][-1] == {"role": "assistant", "content": final["answer"]}

    assert http.delete(f"/sessions/{sid}").status_code == 204
    assert http.get(f"/sessions/{sid}").status_code == 404


def test_one_turn_at_a_time_and_a_hang_up_loses_nothing(http):
    sid = http.post("/sessions", json={"tools": ["survey"]}).json()["id"]
    url = f"/sessions/{sid}/messages"
    with http.stream("POST", url, json={"content": "Survey Paris.", "stream": True,
                                        "tool_choice": [named("survey"), "none"]}) as r:
        events = sse_events(r)
        kind, data = next(events)  # the model called survey: the tool is running now
        assert kind == "model_call" and data["tool_calls"][0]["function"]["name"] == "survey"

        busy = http.post(url, json={"content": "Hurry up."})
        assert busy.status_code == 409
        assert busy.json()["error"]["code"] == "turn_in_progress"
        gone = http.delete(f"/sessions/{sid}")
        assert gone.status_code == 409
        # ...and hang up while the tool still runs.

    wait_idle(http)
    messages = http.get(f"/sessions/{sid}/messages").json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2]["content"] in ("Paris surveyed", "Tokyo surveyed")
    trace = http.get(f"/sessions/{sid}").json()["traces"][-1]
    assert trace["finish_reason"] == "answer"
    # The session is free again.
    again = http.post(url, json={"content": "Thanks.", "tool_choice": ["none"], "max_steps": 1})
    assert again.status_code == 200 and again.json()["finish_reason"] == "answer"
