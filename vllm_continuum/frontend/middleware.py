"""`ClientSessionMiddleware`: vLLM's `--middleware` that reads what agent clients send.

    vllm serve MODEL --scheduler-cls continuum \\
        --middleware vllm_continuum.frontend.middleware.ClientSessionMiddleware

A pure ASGI middleware. For a POST to a generation endpoint (`rewrite.PATHS`)
it reads the body, asks `rewrite.plan_request` what the client sent, and
passes the request on with, at most:

- an `X-Session-ID` header carrying the client's session (only when the
  request has no vLLM session id of its own: vLLM's spellings keep first
  place), which vLLM puts on `Request.session_id`;
- `continuum_ttl_s` / `continuum_last_turn` added to the body's `vllm_xargs`,
  and what the request says of its tool call (tool_hints.py): a forced call
  (`continuum_tool`, `continuum_tool_choice`) and the server's own
  `--tool-call-parser` (`continuum_tool_parser`, read from `app.state.args`).

Every other request, and any request it cannot read, is passed on as it
came (logged once, never failed). vLLM builds the app, and so this
middleware, in every API-server process, so `--api-server-count > 1` needs
nothing more. Its settings are `client_session_sources` and `client_ttls`
in `--additional-config`'s `continuum` section, read on the first request
with the server's arguments.
"""

from __future__ import annotations

import logging

from vllm_continuum.frontend import report
from vllm_continuum.frontend.rewrite import NOTHING, PATHS, Plan, plan_request
from vllm_continuum.frontend.sessions import VLLM_HEADER

logger = logging.getLogger("vllm.continuum.frontend")


class ClientSessionMiddleware:
    def __init__(self, app, settings=None, tool_parser: str | None = None) -> None:
        self.app = app
        self._settings = settings  # a ContinuumConfig; None: read from vLLM's on first use
        self._tool_parser = tool_parser  # the server's --tool-call-parser, if known to us

    async def __call__(self, scope, receive, send):
        if (scope.get("type") != "http" or scope.get("method") != "POST"
                or scope.get("path") not in PATHS):
            return await self.app(scope, receive, send)
        body, disconnected = await _read_body(receive)
        if disconnected:
            return await self.app(scope, _replay(body, receive, disconnect=True), send)
        plan = self._plan(scope, body)
        if plan.session is not None:
            report.session_recognised(plan.session.source)
        for field in plan.lifetime.invalid:
            report.hint_invalid(field)
        scope = _with_changes(scope, plan)
        return await self.app(scope, _replay(plan.body or body, receive), send)

    def _plan(self, scope, body: bytes) -> Plan:
        try:
            settings = self._settings or self._load_settings(scope)
            headers = _headers(scope)
            return plan_request(headers, body, settings.client_session_sources,
                                settings.client_ttls, self._tool_parser)
        except Exception as exc:  # noqa: BLE001  (the request goes on unchanged)
            report.failed(exc)
            return NOTHING

    def _load_settings(self, scope):
        from vllm_continuum.config import ContinuumConfig, config_from_vllm

        state = getattr(scope.get("app"), "state", None)
        try:
            self._settings = config_from_vllm(getattr(state, "vllm_config", None))
        except Exception as exc:  # noqa: BLE001
            logger.warning("continuum: client sessions use the default settings (%s)", exc)
            self._settings = ContinuumConfig()
        self._tool_parser = report.server_tool_parser(getattr(state, "args", None))
        return self._settings


def _headers(scope) -> dict[str, str]:
    """Lower-case header names to their first value."""
    headers: dict[str, str] = {}
    for name, value in scope.get("headers") or ():
        headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return headers


def _with_changes(scope, plan: Plan):
    if plan.session is None and plan.body is None:
        return scope
    headers = list(scope.get("headers") or ())
    if plan.body is not None:
        headers = [(k, v) for k, v in headers
                   if k.lower() not in (b"content-length", b"transfer-encoding")]
        headers.append((b"content-length", str(len(plan.body)).encode()))
    if plan.session is not None:
        # An empty X-Session-ID the client sent would come first and win.
        headers = [(k, v) for k, v in headers if k.lower() != VLLM_HEADER.encode()]
        headers.append((VLLM_HEADER.encode(), plan.session.id.encode("ascii")))
    return {**scope, "headers": headers}


async def _read_body(receive) -> tuple[bytes, bool]:
    """The whole request body, and whether the client disconnected first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks), True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _replay(body: bytes, receive, disconnect: bool = False):
    """A `receive` that gives the app `body` once, then the client's messages."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if disconnect:
            return {"type": "http.disconnect"}
        return await receive()

    return replayed
