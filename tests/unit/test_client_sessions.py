"""Sessions and TTLs read from what agent clients send, one test per spelling,
on the request shapes the clients send (Claude Code's and Codex's first
requests are recorded fixtures: tests/fixtures/clients/)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from vllm_continuum.config import ConfigError, ContinuumConfig, load_config
from vllm_continuum.core.hints import parse_hints
from vllm_continuum.frontend.middleware import ClientSessionMiddleware
from vllm_continuum.frontend.rewrite import plan_request
from vllm_continuum.frontend.sessions import normalise_id, session_in_user_id
from vllm_continuum.frontend.ttls import read_lifetime

FIXTURES = Path(__file__).parents[1] / "fixtures" / "clients"
SOURCES = ContinuumConfig().client_session_sources
UUID = "4e6331bd-b6c5-4a7d-ade9-f0bbe46029f1"


def recorded(name: str) -> tuple[dict, dict]:
    data = json.loads((FIXTURES / name).read_text())
    return {k.lower(): v for k, v in data["headers"].items()}, data["body"]


def plan(headers: dict, body: object, sources=SOURCES, ttls: bool = True):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return plan_request({k.lower(): v for k, v in headers.items()}, raw, sources, ttls)


def xargs(p) -> dict:
    assert p.body is not None
    return json.loads(p.body)["vllm_xargs"]


# --- Claude Code (/v1/messages) ---

def test_claude_code_session_header_and_default_cache_ttl():
    headers, body = recorded("claude_code_2.1.197.json")
    p = plan(headers, body)
    assert p.session.source == "header:x-claude-code-session-id"
    assert p.session.id == headers["x-claude-code-session-id"]
    # cache_control {"type": "ephemeral"} without ttl: Anthropic's 5 minutes.
    assert xargs(p) == {"continuum_ttl_s": 300.0}
    # Nothing else in the body changed.
    new = json.loads(p.body)
    del new["vllm_xargs"]
    assert new == body


def test_claude_code_session_in_metadata_user_id_json_string():
    headers, body = recorded("claude_code_2.1.197.json")
    del headers["x-claude-code-session-id"]
    p = plan(headers, body)
    assert p.session.source == "body:metadata.user_id"
    assert p.session.id == json.loads(body["metadata"]["user_id"])["session_id"]


def test_claude_code_older_user_id_form():
    user_id = f"user_{'ab' * 32}_account_{UUID}_session_{UUID}"
    assert session_in_user_id(user_id) == UUID
    p = plan({}, {"model": "m", "max_tokens": 8, "messages": [],
                  "metadata": {"user_id": user_id}})
    assert (p.session.id, p.session.source) == (UUID, "body:metadata.user_id")


@pytest.mark.parametrize("user_id", ["user-123", "alice@example.com", '{"device_id": "x"}',
                                     "{not json", 42, ""])
def test_a_plain_user_id_is_not_a_session(user_id):
    assert plan({}, {"metadata": {"user_id": user_id}, "messages": []}).session is None


def test_longest_cache_ttl_wins_and_1h_is_an_hour():
    body = {"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "u",
                 "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]}
    assert read_lifetime(body).ttl_s == 3600.0


# --- Codex CLI (/v1/responses) ---

def test_codex_session_headers_and_prompt_cache_key():
    headers, body = recorded("codex_0.171.0.json")
    conversation = body["prompt_cache_key"]
    assert headers["session-id"] == headers["thread-id"] == conversation
    p = plan(headers, body)
    assert (p.session.id, p.session.source) == (conversation, "header:session-id")
    assert p.body is None  # no TTL sent: the body is passed on untouched
    del headers["session-id"]
    assert plan(headers, body).session.source == "header:thread-id"
    del headers["thread-id"]
    assert plan(headers, body).session.source == "body:prompt_cache_key"


@pytest.mark.parametrize("header", ["session_id", "conversation_id"])
def test_older_codex_headers(header):
    p = plan({header: "conv-1"}, {"model": "m", "input": "hi", "stream": True})
    assert (p.session.id, p.session.source) == ("conv-1", f"header:{header}")


@pytest.mark.parametrize("retention, ttl", [("in_memory", 600.0), ("in-memory", 600.0),
                                            ("24h", 86_400.0)])
def test_prompt_cache_retention(retention, ttl):
    p = plan({}, {"model": "m", "input": "hi", "prompt_cache_key": "k",
                  "prompt_cache_retention": retention})
    assert xargs(p) == {"continuum_ttl_s": ttl}


# --- OpenHands SDK / LiteLLM (chat completions) ---

def test_openhands_chat_prompt_cache_key():
    body = {"model": "tiny", "messages": [{"role": "system", "content": "sys"},
                                          {"role": "user", "content": "task"}],
            "tools": [{"type": "function", "function": {"name": "execute_bash",
                                                        "parameters": {"type": "object"}}}],
            "prompt_cache_key": "c0ffee-conversation"}
    p = plan({}, body)
    assert (p.session.id, p.session.source) == ("c0ffee-conversation", "body:prompt_cache_key")


def test_litellm_session_header():
    p = plan({"x-litellm-session-id": "ls-9"}, {"model": "m", "messages": []})
    assert (p.session.id, p.session.source) == ("ls-9", "header:x-litellm-session-id")


def test_session_affinity_header():
    p = plan({"x-session-affinity": "oc-1"}, {"model": "m", "messages": []})
    assert p.session.source == "header:x-session-affinity"


def test_chat_cache_control_on_content_parts():
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "5m"}}]}]}
    assert xargs(plan({"session-id": "s"}, body)) == {"continuum_ttl_s": 300.0}


# --- NVIDIA Dynamo (nvext) ---

def test_dynamo_session_control_and_cache_ttl():
    body = {"model": "m", "messages": [],
            "nvext": {"session_control": {"session_id": "dyn-1", "action": "open", "timeout": 300},
                      "cache_control": {"type": "ephemeral", "ttl": "5m"}}}
    p = plan({}, body)
    assert (p.session.id, p.session.source) == ("dyn-1", "body:nvext.session_control.session_id")
    assert xargs(p) == {"continuum_ttl_s": 300.0}


def test_dynamo_close_is_the_last_turn():
    body = {"model": "m", "messages": [],
            "nvext": {"session_control": {"session_id": "dyn-1", "action": "close"}}}
    assert xargs(plan({}, body)) == {"continuum_last_turn": 1}
    hints = parse_hints(xargs(plan({}, body)), 128)
    assert hints.last_turn and not hints.invalid


# --- vLLM's own spellings keep first place; users are not sessions ---

@pytest.mark.parametrize("headers, extra", [
    ({"X-Session-ID": "mine"}, {}),
    ({}, {"session_id": "mine"}),
    ({}, {"vllm_xargs": {"session_id": "mine"}}),
])
def test_vllm_spellings_are_left_to_vllm(headers, extra):
    headers = {**headers, "x-claude-code-session-id": UUID, "session-id": "other"}
    assert plan(headers, {"model": "m", "messages": [], **extra}).session is None


def test_user_and_safety_identifier_are_never_sessions():
    body = {"model": "m", "messages": [], "user": "alice", "safety_identifier": "h4sh"}
    assert plan({"x-user-id": "alice"}, body).session is None


# --- TTL hints: validated, counted, never overriding the client's own ---

@pytest.mark.parametrize("body, field", [
    ({"messages": [{"role": "user", "content": "x",
                    "cache_control": {"type": "ephemeral", "ttl": "forever"}}]}, "cache_control.ttl"),
    ({"system": [{"type": "text", "text": "s", "cache_control": "yes"}]}, "cache_control.ttl"),
    ({"prompt_cache_retention": "1w"}, "prompt_cache_retention"),
    ({"nvext": {"cache_control": {"ttl": -5}}}, "nvext.cache_control.ttl"),
    ({"nvext": {"session_control": {"action": "kill"}}}, "nvext.session_control.action"),
])
def test_invalid_ttl_values_are_named_and_not_passed_on(body, field):
    p = plan({"session-id": "s"}, {"model": "m", **body})
    assert p.lifetime.invalid == (field,)
    assert p.body is None


def test_the_clients_own_hint_wins():
    body = {"model": "m", "prompt_cache_retention": "24h",
            "vllm_xargs": {"continuum_ttl_s": 5, "other": "x"}}
    assert plan({"session-id": "s"}, body).body is None
    body["nvext"] = {"session_control": {"action": "close"}}
    assert xargs(plan({"session-id": "s"}, body)) == {
        "continuum_ttl_s": 5, "other": "x", "continuum_last_turn": 1}


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]", b'{"vllm_xargs": "x", '
                                 b'"prompt_cache_retention": "24h"}', b"\xff\xfe", b"[" * 100_000])
def test_unreadable_bodies_are_passed_on_unchanged(raw):
    p = plan({"session-id": "s"}, raw)
    assert p.body is None
    assert p.session.source == "header:session-id"


def test_client_ttls_off():
    headers, body = recorded("claude_code_2.1.197.json")
    p = plan(headers, body, ttls=False)
    assert p.body is None and p.session is not None


def test_odd_session_ids_become_a_stable_digest():
    long_id = "x" * 1000
    assert normalise_id(long_id) == normalise_id(long_id) != long_id
    assert normalise_id("sessión").startswith("sha256-")
    assert normalise_id("  ") is None and normalise_id(7) is None


# --- the operator's order ---

def test_operator_adds_a_header_and_turns_a_spelling_off():
    config = load_config(use_env=False, client_session_sources=[
        "header:x-my-agent-run", "body:metadata.user_id"])
    headers, body = recorded("claude_code_2.1.197.json")
    p = plan({**headers, "x-my-agent-run": "run-7"}, body, config.client_session_sources)
    assert (p.session.id, p.session.source) == ("run-7", "header:x-my-agent-run")
    codex_headers, codex_body = recorded("codex_0.171.0.json")
    assert plan(codex_headers, codex_body, config.client_session_sources).session is None
    assert plan(headers, body, []).session is None


@pytest.mark.parametrize("bad", ["user", "body:user", "header:", "header:bad header",
                                 "cookie:x"])
def test_unknown_sources_are_refused_at_start(bad):
    with pytest.raises(ConfigError, match="client_session_sources"):
        load_config(use_env=False, client_session_sources=[bad])


# --- the ASGI middleware around an app that records what it received ---

class Recorder:
    async def __call__(self, scope, receive, send):
        self.scope = scope
        message = await receive()
        self.body = message["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def call(middleware, method, path, headers, body: bytes, chunks: int = 1):
    n = len(body)
    parts = [body[i * n // chunks:(i + 1) * n // chunks] for i in range(chunks)]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
                for i, p in enumerate(parts)]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path,
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(middleware(scope, receive, send))
    return sent


def test_middleware_adds_the_session_header_and_the_hint():
    headers, body = recorded("claude_code_2.1.197.json")
    app = Recorder()
    mw = ClientSessionMiddleware(app, settings=ContinuumConfig())
    raw = json.dumps(body).encode()
    sent = call(mw, "POST", "/v1/messages", {**headers, "content-length": str(len(raw))}, raw,
                chunks=3)
    assert sent[0]["status"] == 200
    got = dict(app.scope["headers"])
    assert got[b"x-session-id"] == headers["x-claude-code-session-id"].encode()
    assert int(got[b"content-length"]) == len(app.body)
    assert json.loads(app.body)["vllm_xargs"] == {"continuum_ttl_s": 300.0}


def test_middleware_leaves_other_requests_alone():
    app = Recorder()
    mw = ClientSessionMiddleware(app, settings=ContinuumConfig())
    raw = b'{"model": "m", "messages": []}'
    call(mw, "POST", "/v1/chat/completions", {"x-session-id": "mine", "session-id": "x"}, raw)
    assert app.body == raw and [k for k, _ in app.scope["headers"]].count(b"x-session-id") == 1
    call(mw, "POST", "/tokenize", {"session-id": "x"}, raw)
    assert app.body == raw and b"x-session-id" not in dict(app.scope["headers"])


def test_an_empty_x_session_id_is_replaced_not_shadowing_the_clients_session():
    app = Recorder()
    mw = ClientSessionMiddleware(app, settings=ContinuumConfig())
    call(mw, "POST", "/v1/responses", {"x-session-id": "", "session-id": "conv-3"},
         b'{"model": "m", "input": "x"}')
    assert [v for k, v in app.scope["headers"] if k == b"x-session-id"] == [b"conv-3"]


def test_middleware_passes_a_request_on_when_its_settings_fail():
    app = Recorder()
    mw = ClientSessionMiddleware(app, settings="not a config")
    raw = b'{"model": "m", "messages": []}'
    sent = call(mw, "POST", "/v1/chat/completions", {"session-id": "x"}, raw)
    assert sent[0]["status"] == 200 and app.body == raw


# --- text-mode agents: mini-swe-agent's fenced command is a tool call by default ---

def test_mini_swe_agent_text_mode_is_a_tool_call_by_default():
    from vllm_continuum.core.tool_calls import TextPatterns

    reader = TextPatterns(ContinuumConfig().all_tool_call_patterns)
    reply = ("THOUGHT: I need to see the files first.\n\n"
             "```mswea_bash_command\ncd /testbed && ls -la\n```")
    assert reader.match(reply) == "cd"
    assert reader.match("```mswea_bash_command\n  python3 -m pytest -x\n```") == "python3"
    for other in ("```bash\nls\n```", "The answer is 42.", "```mswea_bash_command```"):
        assert reader.match(other) is None
