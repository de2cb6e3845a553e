"""What the middleware tells the scheduler about a request's tool call (forced
calls, the server's --tool-call-parser), and how it adds hints: spliced into
the body's bytes, never by serialising the whole body again (#46 item 6)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_continuum.config import ContinuumConfig
from vllm_continuum.frontend import report
from vllm_continuum.frontend.middleware import ClientSessionMiddleware
from vllm_continuum.frontend.rewrite import plan_request, splice_hints
from vllm_continuum.frontend.tool_hints import tool_hints

FIXTURES = Path(__file__).parents[1] / "fixtures" / "clients"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


@pytest.mark.parametrize("choice, hints", [
    ("auto", {}),
    (None, {}),
    ("required", {"continuum_tool_choice": "required"}),  # chat, responses
    ({"type": "any"}, {"continuum_tool_choice": "required"}),  # /v1/messages
    ({"type": "function", "function": {"name": "get_weather"}}, {"continuum_tool": "get_weather"}),
    ({"type": "function", "name": "get_goal"}, {"continuum_tool": "get_goal"}),  # responses
    ({"type": "tool", "name": "Bash"}, {"continuum_tool": "Bash"}),  # /v1/messages
    ({"type": "auto"}, {}),
])
def test_a_forced_tool_choice_becomes_a_hint(choice, hints):
    body = {"tools": TOOLS, **({"tool_choice": choice} if choice is not None else {})}
    assert tool_hints(body, None) == hints


def test_the_parser_goes_only_with_requests_that_may_call_tools():
    assert tool_hints({"tools": TOOLS}, "llama3_json") == {"continuum_tool_parser": "llama3_json"}
    assert tool_hints({"messages": []}, "llama3_json") == {}
    assert tool_hints({"tools": [], "tool_choice": "required"}, "llama3_json") == {}
    assert tool_hints({"tools": TOOLS, "tool_choice": "none"}, "llama3_json") == {}
    assert tool_hints({"tools": TOOLS, "tool_choice": {"type": "none"}}, "llama3_json") == {}


def spliced(body: dict, hints: dict, raw: bytes | None = None) -> dict | None:
    raw = json.dumps(body).encode() if raw is None else raw
    new = splice_hints(raw, json.loads(raw), hints)
    assert new is None or new.startswith(raw[:raw.rindex(b"}")])  # the client's bytes, as sent
    return None if new is None else json.loads(new)


def test_hints_are_spliced_in_and_the_clients_own_win():
    assert spliced({"model": "m"}, {"continuum_ttl_s": 300.0}) == {
        "model": "m", "vllm_xargs": {"continuum_ttl_s": 300.0}}
    mine = {"model": "m", "vllm_xargs": {"session_id": "s", "continuum_ttl_s": 5}}
    assert spliced(mine, {"continuum_ttl_s": 300.0, "continuum_tool": "x"})["vllm_xargs"] == {
        "session_id": "s", "continuum_ttl_s": 5, "continuum_tool": "x"}
    assert spliced(mine, {"continuum_ttl_s": 300.0}) is None  # nothing to add
    assert spliced({}, {"continuum_tool": "x"}) == {"vllm_xargs": {"continuum_tool": "x"}}
    assert spliced({"a": 1}, {"continuum_tool": "x"}, b'{"a": 1}\r\n \t') == {
        "a": 1, "vllm_xargs": {"continuum_tool": "x"}}
    assert spliced({"vllm_xargs": [1]}, {"continuum_tool": "x"}) is None  # not an object
    assert spliced({"a": "\ud800 é"}, {"continuum_tool": "x"})["a"] == "\ud800 é"


def test_a_body_in_another_encoding_is_not_touched():
    raw = '{"model": "m", "tools": []}'.encode("utf-16-le")
    assert splice_hints(raw, json.loads(raw), {"continuum_tool": "x"}) is None
    raw = '{"model": "m"}'.encode("utf-16-be")
    assert splice_hints(raw, json.loads(raw), {"continuum_tool": "x"}) is None


def test_claude_code_forcing_a_tool_is_declared():
    recorded = json.loads((FIXTURES / "claude_code_2.1.197.json").read_text())
    body = {**recorded["body"], "tool_choice": {"type": "tool", "name": "Bash"}}
    headers = {k.lower(): v for k, v in recorded["headers"].items()}
    plan = plan_request(headers, json.dumps(body).encode(), ContinuumConfig().client_session_sources,
                        True, "hermes")
    assert json.loads(plan.body)["vllm_xargs"] == {
        "continuum_ttl_s": 300.0, "continuum_tool_parser": "hermes", "continuum_tool": "Bash"}


class Recorder:
    async def __call__(self, scope, receive, send):
        self.body = (await receive())["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def through(args, body: dict) -> dict:
    """The body the app gets behind the middleware of a server started with `args`."""
    app = Recorder()
    middleware = ClientSessionMiddleware(app)
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
             "app": SimpleNamespace(state=SimpleNamespace(args=args, vllm_config=None))}
    raw = json.dumps(body).encode()

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message):
        pass

    asyncio.run(middleware(scope, receive, send))
    return json.loads(app.body)


def test_the_servers_own_parser_is_read_and_passed_on():
    body = {"model": "m", "messages": [], "tools": TOOLS}
    assert through(SimpleNamespace(tool_call_parser="llama3_json"), body)["vllm_xargs"] == {
        "continuum_tool_parser": "llama3_json"}
    assert "vllm_xargs" not in through(SimpleNamespace(tool_call_parser=None), body)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("vllm.continuum.frontend").addHandler(handler)
    try:
        assert "vllm_xargs" not in through(SimpleNamespace(tool_call_parser="jamba"), body)
    finally:
        logging.getLogger("vllm.continuum.frontend").removeHandler(handler)
    assert any("jamba" in r.getMessage() for r in records)
    assert report.server_tool_parser(SimpleNamespace()) is None


def test_vllm_reads_the_spliced_body_as_the_clients_plus_the_hints():
    """Through vLLM's own body parsing (Starlette's `Request.json`, as
    FastAPI's routes do) into vLLM's request model: a client's own
    `vllm_xargs` is kept, with the hints beside it."""
    from starlette.requests import Request
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
            "tool_choice": "required", "vllm_xargs": {"mine": 1}}
    plan = plan_request({}, json.dumps(body).encode(), [], True, "pythonic")

    async def receive():
        return {"type": "http.request", "body": plan.body, "more_body": False}

    parsed = asyncio.run(Request({"type": "http", "headers": []}, receive).json())
    request = ChatCompletionRequest.model_validate(parsed)
    assert request.vllm_xargs == {"mine": 1, "continuum_tool_parser": "pythonic",
                                  "continuum_tool_choice": "required"}
