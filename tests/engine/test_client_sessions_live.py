"""Agent clients' own session spellings on live servers (tiny model, CPU).

The continuum server runs `ClientSessionMiddleware` (`client_servers` in
tests/engine/conftest.py); the stock server is vLLM without the plugin. Each dialect (client_turns.py)
sends a tool-call turn, other traffic cycles the KV pool while "the tool
runs", and the next turn comes back: on continuum its session is read from
the client's spelling, the paused turn is pinned (`GET /continuum/pins`
names it, `continuum_client_sessions_total` counts its spelling) and the
next turn finds every full block of the paused prompt cached; on stock it
does not.
"""

from __future__ import annotations

import re
import time

import httpx
import pytest
from openai import OpenAI

from tests.engine.client_turns import DIALECTS
from vllm_continuum.cluster.pins_endpoint import session_sha256
from vllm_continuum.demos.pause_scenario import churn

pytestmark = pytest.mark.engine
BLOCK = 32
SOURCES = {"claude-code": "header:x-claude-code-session-id", "codex": "header:session-id",
           "litellm": "body:prompt_cache_key", "dynamo": "body:nvext.session_control.session_id"}
SENDS_TTL = {"claude-code", "dynamo"}


def pinned(base_url: str, session: str, timeout_s: float = 10.0) -> dict | None:
    """This session's entry in GET /continuum/pins, once it appears."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listing = httpx.get(f"{base_url}/continuum/pins", timeout=10).json()
        mine = [p for p in listing["pins"] if p["session_sha256"] == session_sha256(session)]
        if mine:
            return mine[0]
        time.sleep(0.2)
    return None


def sessions_counted(base_url: str, source: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    found = re.search(r'^continuum_client_sessions_total\{[^}]*source="%s"[^}]*\} (\S+)$'
                      % re.escape(source), text, re.M)
    return float(found.group(1)) if found else 0.0


def pause(dialect, base_url: str, seed: int, check=None):
    first = dialect.first(base_url, seed)
    if check:
        check(first)
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=120, max_retries=0)
    churn(client, requests=4, tokens=800, vocab=2000, seed=seed + 1)
    return first, dialect.second(base_url, first.tool_call, seed)


@pytest.mark.parametrize("dialect_cls", DIALECTS, ids=[d.name for d in DIALECTS])
def test_client_session_pins_and_resumes_only_with_continuum(client_servers, dialect_cls):
    name = dialect_cls.name
    seed = 40 + DIALECTS.index(dialect_cls)
    server = client_servers["continuum"]
    before = sessions_counted(server.base_url, SOURCES[name])
    dialect = dialect_cls(seed)
    seen: dict = {}

    def while_paused(first):
        seen["pin"] = pinned(server.base_url, dialect.session)

    first, second = pause(dialect, server.base_url, seed, while_paused)
    assert seen["pin"] is not None, f"{name}: the paused turn was not pinned"
    assert seen["pin"]["blocks"] >= first.prompt_tokens // BLOCK - 1
    assert sessions_counted(server.base_url, SOURCES[name]) >= before + 2
    full_blocks = first.prompt_tokens // BLOCK * BLOCK
    assert first.prompt_tokens >= 10 * BLOCK
    assert second.cached_tokens >= full_blocks, (name, first, second)

    # The scheduler logged the pin's TTL: from the client's hint where it sent one.
    log = server.log_path.read_text()
    line = re.search(rf"session={re.escape(dialect.session)} tool=\S+ ttl=\S+ source=(\S+)", log)
    assert line, f"{name}: no TTL decision logged for its session"
    assert line.group(1).startswith("hint") == (name in SENDS_TTL), line.group(0)

    stock = client_servers["stock"]
    stock_first, stock_second = pause(dialect_cls(seed + 100), stock.base_url, seed + 100)
    assert stock_second.cached_tokens < stock_first.prompt_tokens // BLOCK * BLOCK


def test_dynamo_close_is_a_last_turn_that_pins_nothing(client_servers):
    """`nvext.session_control.action: close` marks the program's last turn: even
    ending in a tool call it is not pinned (a turn without it would be)."""
    dynamo = next(d for d in DIALECTS if d.name == "dynamo")(seed=77)
    dynamo.second_calls_tool = True
    server = client_servers["continuum"]
    first = dynamo.first(server.base_url, 77)
    assert pinned(server.base_url, dynamo.session) is not None
    for seed in range(78, 82):  # the random model's guided call sometimes fails
        last = dynamo.second(server.base_url, first.tool_call, seed)
        if last.tool_call is not None:
            break
    assert last.tool_call is not None  # a tool-call turn, which would otherwise pin
    time.sleep(1.0)  # a snapshot after the last turn's step
    assert pinned(server.base_url, dynamo.session, timeout_s=0.5) is None
    log = server.log_path.read_text()
    assert len(re.findall(rf"session={re.escape(dynamo.session)} tool=", log)) == 1
