"""The agent loop against real vLLM servers (tiny model, guided tool calls).

Tool calls are forced with `tool_choice` per step ("required" or a named
tool, then "none" for the answer): a random-weight model calls tools only
under guided decoding. Failures that a guided model cannot produce (a tool
it was not offered, arguments the schema allows but the tool rejects) come
from registries that deliberately differ from what the model is shown."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from openai import AsyncOpenAI
from pydantic import AfterValidator

from vllm_continuum.agent import AgentLoop, LoopConfig, Session, ToolRegistry, TurnResult
from vllm_continuum.agent.demo_tools import DemoToolConfig, demo_registry
from vllm_continuum.demos.pause_scenario import churn
from vllm_continuum.tools.local_server import flavour_server

pytestmark = pytest.mark.engine

City = Literal["Paris", "Tokyo", "Lima", "Oslo", "Cairo"]
SYSTEM = {"role": "system", "content": "You are a travel agent. Use the tools, then answer."}
NOTES = " ".join(["the river city weather forecast and the hotel price list"] * 25)


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def make_loop(server, registry: ToolRegistry, **config: Any) -> AgentLoop:
    client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=120,
                         max_retries=0)
    settings: dict[str, Any] = {"model": "tiny", "max_steps": 3, "max_tokens": 64,
                                "parallel_tool_calls": False, "temperature": 0.7}
    return AgentLoop(client, registry, LoopConfig(**{**settings, **config}))


def turn(server, registry, session, message, events=None, **kwargs) -> TurnResult:
    config = kwargs.pop("config", {})

    async def go() -> TurnResult:
        loop = make_loop(server, registry, **config)
        try:
            return await loop.run_turn(session, message, on_event=events.append if events is
                                       not None else None, **kwargs)
        finally:
            await loop.client.close()

    return asyncio.run(go())


def roles(session: Session) -> list[str]:
    return [m["role"] for m in session.messages]


def assert_valid_history(session: Session) -> None:
    """Every assistant tool call is answered by exactly one tool message, in order."""
    pending: list[str] = []
    for m in session.messages:
        if m["role"] == "tool":
            assert pending and m["tool_call_id"] == pending.pop(0), m
        else:
            assert not pending, f"unanswered tool calls {pending} before {m['role']}"
        if m["role"] == "assistant":
            pending = [c["id"] for c in m.get("tool_calls") or []]
    assert not pending


def fast_demo_tools() -> ToolRegistry:
    return demo_registry(DemoToolConfig(weather_median_s=0.05, hotel_latency_s=0.05,
                                        hotel_failure_rate=0.0, seed=1))


def test_multi_step_turn_runs_tools_and_answers(live_servers):
    server = live_servers["continuum"]
    registry = fast_demo_tools()
    session = Session(messages=[SYSTEM])
    events: list = []
    result = turn(server, registry, session, "Trip notes: " + NOTES + "\nPlan it.", events,
                  tool_choice=["required", "required", "none"])

    assert result.finish_reason == "answer" and isinstance(result.answer, str), result
    assert roles(session) == ["system", "user", "assistant", "tool", "assistant", "tool",
                              "assistant"]
    assert_valid_history(session)
    assert session.messages[-1] == {"role": "assistant", "content": result.answer}
    calls = result.trace.model_calls
    assert [c.tool_choice for c in calls] == ["required", "required", "none"]
    assert [c.last_turn_hint for c in calls] == [False, False, True]
    assert all(len(c.tool_calls) == 1 and c.tool_calls[0] in registry for c in calls[:2])
    assert calls[2].tool_calls == []
    for c in calls:
        assert 0 < c.ttft_s <= c.duration_s
        assert c.completion_tokens > 0 and c.cached_tokens is not None
    prompts = [c.prompt_tokens for c in calls]
    assert prompts == sorted(prompts) and len(set(prompts)) == 3
    assert [c.after_tool_step for c in calls] == [False, True, True]
    # No other traffic evicts anything here, so every resumed step finds its
    # previous prompt cached (the pin-vs-stock difference is tested below).
    assert [c.pin_resumed for c in calls] == [None, True, True]
    tools = result.trace.tool_calls
    assert [t.name for t in tools] == [c.tool_calls[0] for c in calls[:2]]
    assert all(t.outcome == "ok" and t.duration_s > 0 for t in tools)
    for message, t in zip([m for m in session.messages if m["role"] == "tool"], tools):
        assert message["tool_call_id"] == t.call_id
        json.loads(message["content"])  # the tool's JSON result
    assert [e.type for e in events] == ["model_call", "tool_result", "step", "model_call",
                                        "tool_result", "step", "model_call", "final"]
    assert events[-1].data["answer"] == result.answer

    # The session goes on: a second turn sends the whole history.
    second = turn(server, registry, session, "And the budget?", tool_choice=["required", "none"])
    assert second.finish_reason == "answer" and second.trace.turn == 1
    assert second.trace.model_calls[0].prompt_tokens > prompts[-1]
    assert session.turns == 2 and len(session.traces) == 2
    assert_valid_history(session)


def test_tool_error_and_timeout_become_tool_messages_and_the_turn_goes_on(live_servers):
    registry = ToolRegistry()

    @registry.tool
    def explode(city: City) -> str:
        """Check the city (broken)."""
        raise RuntimeError(f"the {city} database is on fire")

    @registry.tool(timeout_s=0.5)
    async def stall(city: City) -> str:
        """Check the city (hangs)."""
        await asyncio.sleep(30)
        return "never"

    session = Session(messages=[SYSTEM])
    started = time.perf_counter()
    result = turn(live_servers["continuum"], registry, session, "Check a city.",
                  tool_choice=[named("explode"), named("stall"), "none"])
    assert result.finish_reason == "answer"
    assert time.perf_counter() - started < 25  # the hanging tool did not hold the turn
    outcomes = [(t.name, t.outcome) for t in result.trace.tool_calls]
    assert outcomes == [("explode", "error"), ("stall", "timeout")]
    tool_messages = [json.loads(m["content"]) for m in session.messages if m["role"] == "tool"]
    assert tool_messages[0]["error"] == "error"
    assert "RuntimeError: the" in tool_messages[0]["message"]
    assert "database is on fire" in tool_messages[0]["message"]
    assert tool_messages[1] == {"error": "timeout",
                                "message": "tool 'stall' did not return within 0.5 s"}
    assert_valid_history(session)

    # Nothing was lost: the next turn builds on the whole history.
    before = list(session.messages)
    again = turn(live_servers["continuum"], registry, session, "Anything else?",
                 tool_choice=["none"], max_steps=1)
    assert again.finish_reason == "answer"
    assert session.messages[: len(before)] == before
    assert roles(session)[len(before):] == ["user", "assistant"]


class PhantomRegistry(ToolRegistry):
    """Offers the model a tool it does not have (as a stale client would)."""

    def openai_tools(self, names=None):  # noqa: ANN001
        phantom = {
            "type": "function",
            "function": {
                "name": "teleport",
                "description": "Move to a city.",
                "strict": True,
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }
        return [*super().openai_tools(names), phantom]


def closed(city: str) -> str:
    raise ValueError(f"{city} is closed for the season")


def test_unknown_tool_and_invalid_arguments_from_a_real_model(live_servers):
    registry = PhantomRegistry()

    @registry.tool
    def visit(city: Annotated[City, AfterValidator(closed)]) -> str:
        """Visit a city (the schema allows every city, the validator none)."""
        return "unreachable"

    session = Session(messages=[SYSTEM])
    result = turn(live_servers["continuum"], registry, session, "Go somewhere.",
                  tool_choice=[named("teleport"), named("visit"), "none"])
    assert result.finish_reason == "answer"
    outcomes = [(t.name, t.outcome) for t in result.trace.tool_calls]
    assert outcomes == [("teleport", "unknown_tool"), ("visit", "invalid_arguments")]
    contents = [json.loads(m["content"]) for m in session.messages if m["role"] == "tool"]
    assert contents[0]["message"] == "unknown tool 'teleport'; available tools: visit"
    assert "city: Value error," in contents[1]["message"]
    assert "is closed for the season" in contents[1]["message"]
    assert_valid_history(session)


def test_step_limit(live_servers):
    registry = fast_demo_tools()
    session = Session(messages=[SYSTEM])
    result = turn(live_servers["continuum"], registry, session, "Keep using tools.",
                  tool_choice=["required"], max_steps=2)
    assert result.finish_reason == "step_limit" and result.answer is None
    calls = result.trace.model_calls
    assert len(calls) == 2 and all(c.tool_calls for c in calls)
    assert [c.last_turn_hint for c in calls] == [False, True]  # the loop knew step 2 was last
    assert len(result.trace.tool_calls) == 2  # the last step's calls were run and answered
    assert roles(session) == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert_valid_history(session)
    again = turn(live_servers["continuum"], registry, session, "Now answer.",
                 tool_choice=["none"], max_steps=1)
    assert again.finish_reason == "answer"


@pytest.fixture(scope="module")
def debug_server(live_servers, tiny_model_dir, tmp_path_factory):
    """A continuum server whose log shows every TTL decision with its session."""
    shared = live_servers["continuum"]
    if any('"log_level": "DEBUG"' in arg for arg in shared.args):
        yield shared
        return
    settings = {"ttl_policy": "fixed", "default_ttl_s": 30, "log_level": "DEBUG"}
    with flavour_server("continuum", tiny_model_dir, tmp_path_factory.mktemp("agent-debug"),
                        settings=settings) as server:
        yield server


def test_the_session_id_reaches_the_scheduler(debug_server):
    registry = fast_demo_tools()
    session = Session(id=f"agent-{uuid.uuid4().hex[:12]}", messages=[SYSTEM])
    result = turn(debug_server, registry, session, "Check the weather.",
                  tool_choice=["required", "required", "none"])
    assert result.finish_reason == "answer"
    called = [c.tool_calls[0] for c in result.trace.model_calls[:2]]
    pattern = re.compile(rf"continuum: session={re.escape(session.id)} tool=(\S+) ttl=")
    deadline = time.monotonic() + 15
    while True:
        seen = pattern.findall(Path(debug_server.log_path).read_text(errors="replace"))
        if len(seen) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # Both tool steps were pinned under the agent's session id; the final
    # step carried continuum_last_turn and was not.
    assert seen == called


@pytest.mark.parametrize("flavour", ["continuum", "stock"])
def test_a_tool_pause_with_other_traffic_keeps_the_pin_only_on_continuum(live_servers, flavour):
    """The reason for all this: while the tool runs, other traffic fills the
    KV pool. The next step finds its prefix cached on continuum, not on stock
    vLLM; the loop works unchanged on both (stock ignores the session fields)."""
    server = live_servers[flavour]
    registry = ToolRegistry(default_timeout_s=60)

    @registry.tool
    def survey(city: City) -> str:
        """Survey a city (slow, and meanwhile other users' requests go through)."""
        churn_client = __import__("openai").OpenAI(base_url=f"{server.base_url}/v1",
                                                   api_key="unused", max_retries=0, timeout=120)
        churn(churn_client, requests=4, tokens=800, vocab=2000, seed=7)
        return f"{city}: surveyed"

    session = Session(messages=[SYSTEM])
    result = turn(server, registry, session, "Trip notes: " + NOTES + "\nSurvey a city.",
                  tool_choice=[named("survey"), "none"], max_steps=2)
    assert result.finish_reason == "answer"
    assert result.trace.tool_calls[0].outcome == "ok"
    first, second = result.trace.model_calls
    assert first.prompt_tokens > 320
    assert second.pin_resumed is (flavour == "continuum"), (first, second)
