"""The agent's parts that need no model: tool registry (schemas, every failure
outcome, concurrency, timeouts), session store (bounds, expiry), per-step
tool_choice, a model server that is down, and the HTTP service's 4xx paths
(over real HTTP; none of them reaches the model)."""

from __future__ import annotations

import asyncio
import enum
import json
import time
from typing import Annotated, Literal

import httpx
import pytest
from openai import AsyncOpenAI
from pydantic import Field

from vllm_continuum.agent import (
    AgentLoop,
    InMemorySessionStore,
    LoopConfig,
    Session,
    SessionStore,
    StoreFull,
    ToolCallRequest,
    ToolRegistry,
    tool_choice_schedule,
)
from vllm_continuum.agent.demo_tools import DemoToolConfig, demo_registry
from vllm_continuum.agent.runner import ServiceThread
from vllm_continuum.agent.service import AgentService, ServiceLimits, create_app
from vllm_continuum.agent.trace import infer_pin_resumed
from vllm_continuum.tools.local_server import free_port


def run(coro):
    return asyncio.run(coro)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def make_registry() -> ToolRegistry:
    reg = ToolRegistry(default_timeout_s=2.0, max_result_chars=50)

    @reg.tool
    def add(a: int, b: Annotated[int, Field(ge=0, le=9, description="a digit")] = 1) -> int:
        """Add two integers.

        Second paragraph, not part of the description."""
        return a + b

    @reg.tool(timeout_s=0.3)
    async def nap(seconds: float) -> str:
        """Sleep, then say so."""
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @reg.tool(timeout_s=0.3)
    def sync_nap(seconds: float) -> str:
        """Blocking sleep."""
        time.sleep(seconds)
        return "done"

    @reg.tool
    def paint(color: Color, title: str) -> dict:
        """A param named title must survive the title-stripping."""
        return {"color": color.value, "title": title}

    @reg.tool
    def boom(kind: Literal["value", "key"]) -> None:
        """Always fails."""
        raise ValueError("the tool broke") if kind == "value" else KeyError("missing")

    @reg.tool
    def big() -> str:
        """Returns too much."""
        return "x" * 500

    return reg


def call(name: str, arguments: str, id: str = "c1") -> ToolCallRequest:
    return ToolCallRequest(id=id, name=name, arguments=arguments)


# ----------------------------------------------------------------- registry
def test_schema_is_derived_from_the_signature():
    reg = make_registry()
    add = reg.get("add").openai_schema()
    assert add["type"] == "function"
    fn = add["function"]
    assert fn["name"] == "add" and fn["strict"] is True
    assert fn["description"] == "Add two integers."
    params = fn["parameters"]
    assert params["type"] == "object" and params["additionalProperties"] is False
    assert params["required"] == ["a"]
    assert params["properties"]["a"] == {"type": "integer"}
    assert params["properties"]["b"] == {
        "type": "integer", "minimum": 0, "maximum": 9, "default": 1, "description": "a digit"
    }
    paint = reg.get("paint").openai_schema()["function"]["parameters"]
    assert "$defs" not in json.dumps(paint) and "$ref" not in json.dumps(paint)
    assert paint["properties"]["color"]["enum"] == ["red", "blue"]
    assert paint["properties"]["title"] == {"type": "string"}  # the property, kept
    assert "title" not in paint["properties"]["color"]  # pydantic's annotation, dropped
    assert [t["function"]["name"] for t in reg.openai_tools(["nap", "add"])] == ["nap", "add"]


def test_registration_rejects_what_cannot_be_a_tool():
    reg = ToolRegistry()

    def untyped(x):  # noqa: ANN001
        return x

    def star(*args: int) -> None: ...

    with pytest.raises(TypeError, match="annotation"):
        reg.register(untyped)
    with pytest.raises(TypeError, match="keyword"):
        reg.register(star)
    reg.register(lambda: 1, name="one")
    with pytest.raises(ValueError, match="already"):
        reg.register(lambda: 2, name="one")
    with pytest.raises(ValueError, match="tool name"):
        reg.register(lambda: 2, name="bad name!")
    with pytest.raises(ValueError, match="timeout"):
        reg.register(lambda: 2, name="two", timeout_s=0)


@pytest.mark.parametrize(
    ("name", "arguments", "outcome", "content_has"),
    [
        ("add", '{"a": 2, "b": 3}', "ok", "5"),
        ("add", "", "invalid_arguments", "a: Field required"),
        ("add", '{"a": 2, "b": 10}', "invalid_arguments", "b: Input should be less than or equal"),
        ("add", '{"a": 2, "c": 1}', "invalid_arguments", "c: Extra inputs are not permitted"),
        ("add", '{"a": 2', "invalid_json", "not valid JSON"),
        ("add", "[1, 2]", "invalid_json", "must be a JSON object"),
        ("nope", "{}", "unknown_tool", "unknown tool 'nope'; available tools: add, nap"),
        ("nap", '{"seconds": 5}', "timeout", "did not return within 0.3 s"),
        ("sync_nap", '{"seconds": 0.8}', "timeout", "did not return within 0.3 s"),
        ("boom", '{"kind": "value"}', "error", "ValueError: the tool broke"),
        ("boom", '{"kind": "key"}', "error", "KeyError"),
        ("paint", '{"color": "red", "title": "t"}', "ok", '{"color":"red","title":"t"}'),
        ("big", "{}", "ok", "...[truncated 450 chars]"),
    ],
)
def test_every_outcome_becomes_a_tool_message(name, arguments, outcome, content_has):
    result = run(make_registry().execute(call(name, arguments, id="call-7")))
    assert result.outcome == outcome, result
    assert content_has in result.content
    message = result.message()
    assert message == {"role": "tool", "tool_call_id": "call-7", "content": result.content}
    if outcome != "ok":
        assert json.loads(result.content) == {"error": outcome, "message": result.error}
    assert result.duration_s < 1.5


def test_a_session_subset_makes_other_tools_unknown():
    result = run(make_registry().execute(call("add", '{"a": 1}'), allowed=["nap", "big"]))
    assert result.outcome == "unknown_tool"
    assert "available tools: nap, big" in result.content


def test_parallel_calls_run_concurrently_and_keep_their_order():
    reg = ToolRegistry(default_timeout_s=5)

    @reg.tool
    async def wait(seconds: float, tag: str) -> str:
        """Sleep."""
        await asyncio.sleep(seconds)
        return tag

    calls = [call("wait", json.dumps({"seconds": s, "tag": t}), id=t)
             for s, t in [(0.4, "a"), (0.1, "b"), (0.4, "c"), (0.0, "d")]]
    started = time.perf_counter()
    results = run(reg.execute_all(calls))
    elapsed = time.perf_counter() - started
    assert [r.content for r in results] == ["a", "b", "c", "d"]
    assert [r.call_id for r in results] == ["a", "b", "c", "d"]
    assert elapsed < 0.8, f"calls ran one after another ({elapsed:.2f} s)"


def test_demo_tools():
    reg = demo_registry(DemoToolConfig(weather_median_s=0.01, hotel_latency_s=0.0,
                                       hotel_failure_rate=1.0, seed=3))
    ok = run(reg.execute(call("calculator", '{"op": "mul", "a": 6, "b": 7}')))
    assert ok.outcome == "ok" and json.loads(ok.content)["result"] == 42
    zero = run(reg.execute(call("calculator", '{"op": "div", "a": 6, "b": 0}')))
    assert zero.outcome == "error" and "ZeroDivisionError" in zero.content
    weather = run(reg.execute(call("get_weather", '{"city": "Oslo"}')))
    assert weather.outcome == "ok" and json.loads(weather.content)["city"] == "Oslo"
    hotel = run(reg.execute(call("book_hotel", '{"city": "Lima", "nights": 2}')))
    assert hotel.outcome == "error" and "unavailable" in hotel.content
    # Only enums and bounded integers: what a random model closes under guided decoding.
    for tool in reg.openai_tools():
        for prop in tool["function"]["parameters"]["properties"].values():
            assert "enum" in prop or ("minimum" in prop and "maximum" in prop), prop


def test_weather_latency_has_a_long_tail():
    cfg = DemoToolConfig(weather_median_s=0.001, weather_sigma=1.0, seed=0)
    reg = demo_registry(cfg)
    durations = sorted(
        run(reg.execute(call("get_weather", '{"city": "Paris"}'))).duration_s for _ in range(60)
    )
    median, top = durations[30], durations[-1]
    assert top > 4 * median  # log-normal: the slowest calls are many times the median


# -------------------------------------------------------------- tool_choice
def test_tool_choice_schedule():
    default = tool_choice_schedule(None)
    assert [default(s, 3) for s in range(3)] == ["auto", "auto", "none"]
    single = tool_choice_schedule("required")
    assert [single(s, 3) for s in range(3)] == ["required", "required", "none"]
    listed = tool_choice_schedule(["required", "auto"])
    assert [listed(s, 4) for s in range(4)] == ["required", "auto", "auto", "auto"]
    named = {"type": "function", "function": {"name": "x"}}
    assert tool_choice_schedule(named)(0, 2) == named
    assert tool_choice_schedule(lambda s, n: "none")(0, 5) == "none"
    with pytest.raises(ValueError):
        tool_choice_schedule([])


def test_pin_inference_counts_full_blocks():
    assert infer_pin_resumed(100, 96, 32) is True  # 3 full blocks = 96
    assert infer_pin_resumed(100, 64, 32) is False
    assert infer_pin_resumed(20, 0, 32) is None  # no full block: cannot tell
    assert infer_pin_resumed(None, 64, 32) is None
    assert infer_pin_resumed(100, None, 32) is None


# -------------------------------------------------------------------- store
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_store_is_bounded():
    store = InMemorySessionStore(max_sessions=2, ttl_s=60)
    assert isinstance(store, SessionStore)
    a, b = Session(), Session()
    run(store.create(a))
    run(store.create(b))
    with pytest.raises(StoreFull, match="full"):
        run(store.create(Session()))
    with pytest.raises(ValueError, match="exists"):
        run(store.create(Session(id=a.id)))
    assert run(store.delete(a.id)) is True
    assert run(store.delete(a.id)) is False
    run(store.create(Session()))  # room again
    assert len(store) == 2


def test_store_expires_idle_sessions_and_use_keeps_them():
    clock = Clock()
    store = InMemorySessionStore(max_sessions=2, ttl_s=10, clock=clock)
    a, b = Session(), Session()
    run(store.create(a))
    clock.now = 5
    run(store.create(b))
    clock.now = 9
    assert run(store.get(a.id)) is a  # a use: a now lives until 19
    clock.now = 16
    assert run(store.get(b.id)) is None  # idle since 5
    assert run(store.get(a.id)) is a
    run(store.create(Session()))
    run(store.save(b))  # an upsert: a session that expired mid-turn comes back
    assert run(store.get(b.id)) is b
    clock.now = 100
    assert len(store) == 0
    run(store.create(Session()))  # expired sessions free their room


# ------------------------------------------------------- model server down
def test_a_dead_model_server_ends_the_turn_without_losing_the_session():
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="x",
                         max_retries=0, timeout=5)
    loop = AgentLoop(client, make_registry(), LoopConfig(model="m", max_steps=3))
    session = Session(messages=[{"role": "system", "content": "s"}])
    result = run(loop.run_turn(session, "hello"))
    assert result.finish_reason == "model_error" and result.answer is None
    assert "APIConnectionError" in result.error
    assert result.trace.model_calls[0].error == result.error
    assert session.messages == [{"role": "system", "content": "s"},
                                {"role": "user", "content": "hello"}]
    assert session.turns == 1 and session.traces[-1] is result.trace


# ------------------------------------------------- the HTTP service's 4xx
@pytest.fixture(scope="module")
def offline_service():
    """The service over real HTTP, its model server unreachable: every 4xx
    is decided before a model is called."""
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="x",
                         max_retries=0, timeout=5)
    loop = AgentLoop(client, make_registry(),
                     LoopConfig(model="m", max_steps=3, max_history_messages=12,
                                max_tool_calls_per_step=2))
    store = InMemorySessionStore(max_sessions=3, ttl_s=600)
    limits = ServiceLimits(max_message_chars=100, max_system_chars=50, max_body_bytes=2000,
                           max_steps=4)
    with ServiceThread(create_app(AgentService(loop, store, limits))) as thread:
        with httpx.Client(base_url=thread.base_url, timeout=30) as http:
            yield http, store


def assert_error(response: httpx.Response, status: int, code: str, text: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    assert text in error["message"], error


def test_service_4xx(offline_service):
    http, store = offline_service
    sid = http.post("/sessions", json={"system": "be brief", "tools": ["add", "nap"]}).json()["id"]
    url = f"/sessions/{sid}/messages"

    for method, path in [("GET", "/sessions/nope"), ("GET", "/sessions/nope/messages"),
                         ("DELETE", "/sessions/nope"), ("POST", "/sessions/nope/messages")]:
        r = http.request(method, path, json={"content": "hi"} if method == "POST" else None)
        assert_error(r, 404, "session_not_found", "no session 'nope'")

    r = http.post(url, content=b'{"content": "hi"', headers={"content-type": "application/json"})
    assert_error(r, 400, "invalid_json", "not valid JSON")
    assert_error(http.post(url, json={}), 422, "invalid_body", "content: Field required")
    assert_error(http.post(url, json={"content": 5}), 422, "invalid_body", "content:")
    assert_error(http.post(url, json={"content": "hi", "temperature": 2}), 422, "invalid_body",
                 "temperature: Extra inputs are not permitted")
    assert_error(http.post(url, json={"content": "hi", "tool_choice": "sometimes"}), 422,
                 "invalid_body", "tool_choice")
    assert_error(http.post(url, json={"content": "hi", "max_steps": 0}), 422, "invalid_body",
                 "max_steps")
    assert_error(http.post(url, json={"content": "hi", "max_steps": 5}), 422, "too_many_steps",
                 "the limit is 4")
    assert_error(http.post(url, json={"content": "hi", "tool_choice": []}), 422,
                 "invalid_tool_choice", "1 to 4 items")
    named = {"type": "function", "function": {"name": "big"}}
    assert_error(http.post(url, json={"content": "hi", "tool_choice": named}), 422,
                 "unknown_tool", "'big', which is not a tool of this session")
    assert_error(http.post(url, json={"content": "   "}), 422, "empty_message", "empty")
    assert_error(http.post(url, json={"content": "x" * 101}), 413, "message_too_large",
                 "message is 101 characters; the limit is 100")
    assert_error(http.post(url, json={"content": "x" * 3000}), 413, "body_too_large",
                 "over the limit of 2000 bytes")

    def chunked():
        for _ in range(30):
            yield b" " * 100

    r = http.post(url, content=chunked(), headers={"content-type": "application/json"})
    assert_error(r, 413, "body_too_large", "2000 bytes")  # no content-length: counted

    assert_error(http.post("/sessions", json={"tools": ["add", "teleport"]}), 422,
                 "unknown_tool", "unknown tools ['teleport']")
    assert_error(http.post("/sessions", json={"system": "s" * 51}), 413, "system_too_large",
                 "limit is 50")
    assert_error(http.post("/sessions", json={"tool": []}), 422, "invalid_body", "tool: Extra")

    # None of that touched the session.
    assert http.get(f"/sessions/{sid}/messages").json()["messages"] == [
        {"role": "system", "content": "be brief"}
    ]
    assert http.delete(f"/sessions/{sid}").status_code == 204
    assert_error(http.get(f"/sessions/{sid}"), 404, "session_not_found", sid)


def test_service_store_full_and_history_full(offline_service):
    http, store = offline_service
    for sid in list(store._sessions):
        assert http.delete(f"/sessions/{sid}").status_code == 204
    ids = [http.post("/sessions").json()["id"] for _ in range(3)]
    assert_error(http.post("/sessions"), 503, "store_full", "3 live sessions")

    # A model failure: 502 with the trace, the user's message kept.
    r = http.post(f"/sessions/{ids[0]}/messages", json={"content": "hello"})
    assert_error(r, 502, "model_error", "APIConnectionError")
    assert r.json()["trace"]["finish_reason"] == "model_error"
    messages = http.get(f"/sessions/{ids[0]}/messages").json()["messages"]
    assert messages == [{"role": "user", "content": "hello"}]

    # History bound (12 messages): failed turns still add their user message.
    for _ in range(10):
        assert http.post(f"/sessions/{ids[0]}/messages", json={"content": "again"}).status_code \
            == 502
    assert_error(http.post(f"/sessions/{ids[0]}/messages", json={"content": "more"}), 409,
                 "history_full", "holds 11 messages; the limit is 12")
    for sid in ids:
        http.delete(f"/sessions/{sid}")


def test_callable_objects_and_partials_are_tools():
    import functools

    class Lookup:
        async def __call__(self, key: Literal["a", "b"]) -> str:
            return key.upper()

    async def scale(factor: int, x: int) -> int:
        return factor * x

    reg = ToolRegistry()
    reg.register(Lookup(), name="lookup", description="Look a key up.")
    reg.register(functools.partial(scale, 3), name="triple", description="Triple x.")
    assert reg.get("triple").openai_schema()["function"]["parameters"]["required"] == ["x"]
    assert run(reg.execute(call("lookup", '{"key": "b"}'))).content == "B"
    assert run(reg.execute(call("triple", '{"x": 5}'))).content == "15"
    assert run(reg.execute(call("triple", '{"x": 5, "factor": 2}'))).outcome == \
        "invalid_arguments"


def test_every_model_call_sends_the_session_as_header_and_body():
    """Routers hash the X-Session-ID header (vllm-router consistent_hash); vLLM
    reads the body field first. Both carry the session on every call."""
    from vllm_continuum.agent.loop import session_header_value

    seen: list[tuple[str | None, dict]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.headers.get("x-session-id"), body))
        return httpx.Response(200, json={
            "id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "done"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        })

    client = AsyncOpenAI(base_url="http://test/v1", api_key="x", max_retries=0,
                         http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    loop = AgentLoop(client, make_registry(), LoopConfig(model="m", stream=False, max_steps=2))
    session = Session(id="agent-42")
    result = run(loop.run_turn(session, "hi"))
    assert result.answer == "done"
    assert seen and all(h == "agent-42" and b["session_id"] == "agent-42" for h, b in seen)

    # Ids that are not short printable ASCII go out as a stable digest in the header.
    odd = "séance-" + "x" * 300
    assert session_header_value(odd) == session_header_value(odd)
    assert session_header_value(odd).startswith("sha256:") and session_header_value(odd).isascii()

    # session_hints=False: neither header nor body field.
    seen.clear()
    loop = AgentLoop(client, make_registry(),
                     LoopConfig(model="m", stream=False, max_steps=1, session_hints=False))
    run(loop.run_turn(Session(id="agent-43"), "hi"))
    assert seen and all(h is None and "session_id" not in b for h, b in seen)
