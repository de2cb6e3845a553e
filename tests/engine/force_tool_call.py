"""Test-only server hook: the tiny random-weight model calls one of the client's tools.

A random model calls no tool on its own and, asked for 32,000 tokens,
writes them all. Loaded as the last `--middleware` on the real-client test
servers (so it is the outermost: the plugin's middleware sees the request as
it leaves it), this hook changes only the sampling side of a request: the
first turn of a conversation is made to call a tool the client itself offered
(`FORCED`, one without arguments where the client has one: a forced
`tool_choice`, as an agent forcing its next step sends it), later turns to
answer in a few tokens. The client, its session spellings, its messages and
its tools are passed on as it sent them. It adds no continuum hint: the
scheduler and the plugin's middleware must recognise the call themselves.
With `FORCE_TOOL_CALL_STEER=0` it only holds and records (a server whose
model writes its calls itself, tests/engine/scripted_tool_calls.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

# Per endpoint: the offered tool to force (by name), else any tool.
FORCED = {"/v1/responses": "get_goal"}
FIRST_TURN_TOKENS, LATER_TURN_TOKENS = 48, 8
# While this file exists, a later turn waits (after creating `<gate>.waiting`):
# the test cycles the KV pool during the "tool pause", then removes it.
GATE_ENV = "FORCE_TOOL_CALL_GATE"
GATE_TIMEOUT_S = 300.0
# Each request's turn and usage, one JSON line (the clients show no usage).
LOG_ENV = "FORCE_TOOL_CALL_LOG"
STEER_ENV = "FORCE_TOOL_CALL_STEER"  # "0": hold and record only


def _later_turn(path: str, body: dict) -> bool:
    if path == "/v1/responses":
        items = body.get("input") if isinstance(body.get("input"), list) else []
        return any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items)
    messages = body.get("messages") or []
    return any(isinstance(m, dict) and m.get("role") in ("assistant", "tool") for m in messages)


def steer(path: str, body: dict) -> dict:
    """The request with its tool choice and token budget set for the tiny model."""
    tools = body.get("tools") or []
    later = _later_turn(path, body)
    budget = LATER_TURN_TOKENS if later else FIRST_TURN_TOKENS
    if path == "/v1/responses":
        body["max_output_tokens"] = budget
        names = {t.get("name") for t in tools if isinstance(t, dict)}
        if not later and FORCED[path] in names:
            body["tool_choice"] = {"type": "function", "name": FORCED[path]}
            body["parallel_tool_calls"] = False
        elif later:
            body["tool_choice"] = "none"
    elif path == "/v1/messages":
        body["max_tokens"] = budget
        body.pop("thinking", None)  # the tiny model has no reasoning parser
        if tools:
            body["tool_choice"] = ({"type": "none"} if later else
                                   {"type": "any", "disable_parallel_tool_use": True})
    elif path == "/v1/chat/completions":
        body["max_tokens"] = budget
        if tools:
            body["tool_choice"] = "none" if later else "required"
            body["parallel_tool_calls"] = False
    return body


class ForceToolCall:
    """Pure ASGI middleware applying `steer` to JSON POSTs of the three endpoints."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path")
        if scope.get("type") != "http" or scope.get("method") != "POST" or path not in (
                "/v1/responses", "/v1/messages", "/v1/chat/completions"):
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False) and message["type"] == "http.request"
        raw = b"".join(chunks)
        try:
            body = json.loads(raw)
            later = _later_turn(path, body)
            if os.environ.get(STEER_ENV) != "0":
                raw = json.dumps(steer(path, body)).encode()
        except (ValueError, AttributeError, TypeError):
            later = False
        if later:
            await _pass_gate()
        send = _recording(send, path, later, scope["headers"])
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(raw)).encode()))
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}

        return await self.app({**scope, "headers": headers}, replay, send)


async def _pass_gate() -> None:
    gate = os.environ.get(GATE_ENV)
    if not gate or not Path(gate).exists():
        return
    Path(gate + ".waiting").touch()
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while Path(gate).exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


def usage_of(path: str, response: bytes) -> dict:
    """Prompt and cached tokens of a response, JSON or SSE (the largest over
    its events: streams report usage more than once)."""
    prompt = cached = 0
    for usage in _usages(response):
        if path == "/v1/messages":
            read = usage.get("cache_read_input_tokens") or 0
            total = (usage.get("input_tokens") or 0) + read + (
                usage.get("cache_creation_input_tokens") or 0)
        elif path == "/v1/responses":
            read = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
            total = usage.get("input_tokens") or 0
        else:
            read = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            total = usage.get("prompt_tokens") or 0
        prompt, cached = max(prompt, total), max(cached, read)
    return {"prompt": prompt, "cached": cached}


def _usages(response: bytes):
    lines = [line[5:] for line in response.splitlines() if line.startswith(b"data:")]
    for text in lines or [response]:
        try:
            yield from _find_usage(json.loads(text))
        except ValueError:
            continue


def _find_usage(node):
    if isinstance(node, dict):
        if isinstance(node.get("usage"), dict):
            yield node["usage"]
        for value in node.values():
            if isinstance(value, (dict, list)):
                yield from _find_usage(value)
    elif isinstance(node, list):
        for value in node:
            yield from _find_usage(value)


def _recording(send, path: str, later: bool, headers):
    log = os.environ.get(LOG_ENV)
    if not log:
        return send
    chunks: list[bytes] = []
    session = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}

    async def recording_send(message):
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                row = {"path": path, "later": later, **usage_of(path, b"".join(chunks)),
                       "session": session.get("x-claude-code-session-id")
                       or session.get("session-id") or session.get("x-session-id")}
                with open(log, "a") as f:
                    f.write(json.dumps(row) + "\n")
        await send(message)

    return recording_send
