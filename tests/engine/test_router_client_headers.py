"""Which key vllm-router (0.1.17, `consistent_hash`) routes agent clients on.

Two stand-in workers that answer with their own port sit behind a real
`vllm-router`; the recorded Claude Code, Codex and LiteLLM requests are sent
for eight sessions each, the session id changed in every spelling the client
uses. What docs/scaling.md says is what this measures: the router spreads
sessions only by `X-Session-ID`; these clients' own spellings give every
session the same key, so all their sessions land on one worker (their turns
stay together, nothing is spread) until the client also sends `X-Session-ID`.
"""

from __future__ import annotations

import copy
import http.server
import json
import threading
import uuid
from pathlib import Path

import httpx
import pytest

from vllm_continuum.cluster.local_cluster import Router

pytestmark = pytest.mark.engine
FIXTURES = Path(__file__).parents[1] / "fixtures" / "clients"
CLIENTS = ("claude_code_2.1.197.json", "codex_0.171.0.json", "litellm_1.110.2.json")
SESSIONS = 8


class Worker(http.server.BaseHTTPRequestHandler):
    """Answers everything with 200 and its own port (health, models, completions)."""

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        port = self.server.server_address[1]
        body = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}],
                           "worker": port}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    workers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Worker) for _ in range(2)]
    for w in workers:
        threading.Thread(target=w.serve_forever, daemon=True).start()
    urls = [f"http://127.0.0.1:{w.server_address[1]}" for w in workers]
    log = tmp_path_factory.mktemp("router") / "router.log"
    try:
        with Router(worker_urls=urls, log_path=log) as r:
            yield r
    finally:
        for w in workers:
            w.shutdown()


def session_request(name: str, session: str, x_session_id: bool):
    """The recorded request with `session` in each of the client's spellings."""
    data = json.loads((FIXTURES / name).read_text())
    headers = {k: v for k, v in data["headers"].items()
               if k.lower() not in ("content-length", "accept-encoding")}
    body = copy.deepcopy(data["body"])
    for key in headers:
        if key.lower() in ("x-claude-code-session-id", "session-id", "thread-id"):
            headers[key] = session
    if "metadata" in body:
        body["metadata"]["user_id"] = json.dumps(
            {"device_id": "d" * 64, "account_uuid": "", "session_id": session})
    if "prompt_cache_key" in body:
        body["prompt_cache_key"] = session
    if x_session_id:
        headers["X-Session-ID"] = session
    return data["path"], headers, json.dumps(body)


def worker_of(router, name: str, session: str, x_session_id: bool) -> int:
    path, headers, body = session_request(name, session, x_session_id)
    response = httpx.post(f"{router.base_url}{path}", headers=headers, content=body, timeout=30)
    assert response.status_code == 200, response.text[:300]
    return response.json()["worker"]


@pytest.mark.parametrize("name", CLIENTS)
def test_router_spreads_client_sessions_only_by_x_session_id(router, name):
    sessions = [str(uuid.UUID(int=i + 1)) for i in range(SESSIONS)]
    own = {worker_of(router, name, s, x_session_id=False) for s in sessions}
    assert len(own) == 1, f"{name}: the router spread sessions by the client's own spelling"
    placed = {s: worker_of(router, name, s, x_session_id=True) for s in sessions}
    assert len(set(placed.values())) == 2, placed
    again = {s: worker_of(router, name, s, x_session_id=True) for s in sessions}
    assert again == placed  # a session's turns stay on its worker
