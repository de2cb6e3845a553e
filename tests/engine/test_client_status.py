"""No request that stock vLLM answers gets another status with the plugin.

The same payloads go to the stock server (vLLM without the plugin) and to
the continuum server with `ClientSessionMiddleware` (`client_servers` in
tests/engine/conftest.py): the recorded requests of Claude Code, Codex and LiteLLM as they came, the
same trimmed to fit the tiny model's context, and seeded fuzz around every
field the middleware reads (session spellings, `cache_control`,
`prompt_cache_retention`, `nvext`, `vllm_xargs`) plus bodies that are not
JSON objects. Every status must match.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.engine
FIXTURES = Path(__file__).parents[1] / "fixtures" / "clients"
PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
ODD = ["", "k", 5, None, {"a": 1}, ["x"], "é" * 10, "x" * 5000, True, 1.5]
TTLS = ["5m", "1h", "forever", 5, -1, None, {"x": 1}, "1e9h", float("nan")]


def recorded(name: str) -> tuple[str, dict, dict]:
    data = json.loads((FIXTURES / name).read_text())
    return data["path"], data["headers"], data["body"]


def trimmed(path: str, headers: dict, body: dict) -> tuple[str, dict, dict]:
    """The recorded request cut to fit a 2k context: short texts, one tool."""
    body = copy.deepcopy(body)
    body["tools"] = body.get("tools", [])[:1]

    def cut(node):
        if isinstance(node, dict):
            return {k: (v[:200] if k in ("text", "instructions") and isinstance(v, str) else cut(v))
                    for k, v in node.items()}
        return [cut(x) for x in node] if isinstance(node, list) else node

    body = cut(body)
    for key in ("max_tokens", "max_output_tokens"):
        if key in body or path.endswith(("messages", "responses")):
            body[key] = 4
    if path.endswith("responses"):
        body.pop("max_tokens", None)
    return path, headers, body


def base_body(path: str) -> dict:
    if path.endswith("completions") and "chat" not in path:
        return {"model": "tiny", "prompt": "hello there", "max_tokens": 4}
    if path.endswith("responses"):
        return {"model": "tiny", "input": "hello there", "max_output_tokens": 4}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 4}
    if path.endswith("messages"):
        body["system"] = [{"type": "text", "text": "Be brief."}]
    return body


def mutate(rng: random.Random, path: str, body: dict, headers: dict) -> None:
    choice = rng.randrange(10)
    if choice == 0:
        body["prompt_cache_key"] = rng.choice(ODD)
    elif choice == 1:
        body["metadata"] = rng.choice([{"user_id": rng.choice(ODD + [
            '{"session_id": "s-1"}', "user_ab_account_x_session_0123456789abcdef", "{bad"])},
            "meta", 5, None])
    elif choice == 2:
        name = rng.choice(["x-claude-code-session-id", "session-id", "thread-id", "session_id",
                           "conversation_id", "x-litellm-session-id", "x-session-affinity",
                           "x-session-id"])
        headers[name] = rng.choice(["", "abc", "x" * 3000, "s p a c e", "a\tb"])
    elif choice == 3:
        control = rng.choice([{"type": "ephemeral", "ttl": rng.choice(TTLS)},
                              {"type": "ephemeral"}, "yes", {"type": "other"}, 5])
        if "messages" in body:
            body["messages"][-1]["content"] = [{"type": "text", "text": "hi",
                                                "cache_control": control}]
        body.setdefault("system", [{"type": "text", "text": "s"}])
        if isinstance(body["system"], list):
            body["system"][0]["cache_control"] = control
    elif choice == 4:
        body["prompt_cache_retention"] = rng.choice(["in_memory", "in-memory", "24h", "1w", 5,
                                                     None, ""])
    elif choice == 5:
        body["nvext"] = rng.choice([
            {"session_control": {"session_id": rng.choice(ODD),
                                 "action": rng.choice(["open", "close", "kill", 5])}},
            {"cache_control": {"ttl": rng.choice(TTLS)}}, "nv", [1]])
    elif choice == 6:
        body["vllm_xargs"] = rng.choice([None, "s", [1], {"a": 1}, {"continuum_ttl_s": "abc"},
                                         {"nested": {"x": 1}}, {"session_id": 5},
                                         {"continuum_last_turn": 1}])
    elif choice == 7:
        body["session_id"] = rng.choice(ODD)
    elif choice == 8:
        body["user"], body["safety_identifier"] = rng.choice(ODD), rng.choice(ODD)
    else:
        body["stream"] = True


def payloads() -> list[tuple[str, str, dict, bytes]]:
    cases = []
    for name in ("claude_code_2.1.197.json", "codex_0.171.0.json", "litellm_1.110.2.json"):
        path, headers, body = recorded(name)
        cases.append((f"recorded {name}", path, headers, body))
        cases.append((f"trimmed {name}", *trimmed(path, headers, body)))
    rng = random.Random(30)
    for i in range(64):
        path = PATHS[i % len(PATHS)]
        body, headers = base_body(path), {}
        for _ in range(rng.randint(1, 3)):
            mutate(rng, path, body, headers)
        cases.append((f"fuzz {i}", path, headers, body))
    raw = [b"", b"not json", b"[1, 2]", b'{"model": "tiny"', b"\xff\xfe{}", b"[" * 50_000,
           b'{"model": "tiny", "messages": [], "prompt_cache_key": "k", "max_tokens": 4}']
    for i, body in enumerate(raw):
        cases.append((f"raw {i}", PATHS[i % len(PATHS)], {"session-id": "s"}, body))
    return [(label, path, headers,
             body if isinstance(body, bytes) else json.dumps(body).encode())
            for label, path, headers, body in cases]


def status(base_url: str, path: str, headers: dict, body: bytes) -> int:
    headers = {k: v for k, v in headers.items() if k.lower() not in ("content-length", "host")}
    headers.setdefault("content-type", "application/json")
    with httpx.stream("POST", f"{base_url}{path}", headers=headers, content=body,
                      timeout=120) as response:
        response.read()
        return response.status_code


def test_every_payload_gets_the_status_stock_vllm_gives(client_servers):
    cases = payloads()
    differ, statuses = [], []
    for label, path, headers, body in cases:
        got = {f: status(s.base_url, path, headers, body) for f, s in client_servers.items()}
        statuses.append(got["stock"])
        if got["stock"] != got["continuum"]:
            differ.append((label, path, got))
    assert not differ, differ
    # The payloads reach the model, not only the validators.
    assert statuses.count(200) >= len(cases) // 3, statuses
    # The middleware read every one (vLLM's own handlers may log tracebacks
    # for the requests they refuse, on both servers).
    log = client_servers["continuum"].log_path.read_text()
    assert "vllm_continuum/frontend" not in log and "passed on unread" not in log
