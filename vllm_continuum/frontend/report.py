"""Counting and logging what the API server read from clients.

Two Prometheus counters, served on vLLM's `/metrics` (with
`--api-server-count > 1` through prometheus_client's multiprocess files,
which vLLM sets up before it starts the API-server processes):

- `continuum_client_sessions_total{source}`: requests whose session came
  from that `client_session_sources` entry;
- `continuum_client_hints_invalid_total{field}`: client TTL fields that
  were not understood (ignored; the request is served as without them).

Each source and each invalid field is also logged once per process.
"""

from __future__ import annotations

import logging

from vllm_continuum.frontend.tool_hints import known_parser

logger = logging.getLogger("vllm.continuum.frontend")

SESSIONS = "continuum_client_sessions"
INVALID = "continuum_client_hints_invalid"
_counters: dict = {}
_logged: set[tuple[str, str]] = set()


def _counter(name: str, doc: str, label: str):
    if name not in _counters:
        try:
            from prometheus_client import Counter

            _counters[name] = Counter(name, doc, [label])
        except Exception as exc:  # noqa: BLE001  (a metric must never fail a request)
            logger.warning("continuum: counter %s unavailable (%r)", name, exc)
            _counters[name] = None
    return _counters[name]


def session_recognised(source: str) -> None:
    counter = _counter(SESSIONS, "Requests whose session was read from a client's spelling.",
                       "source")
    if counter is not None:
        counter.labels(source=source).inc()
    _once("source", source, logging.INFO,
          "continuum: reading sessions from %s (first request that had no vLLM session id)")


def hint_invalid(field: str) -> None:
    counter = _counter(INVALID, "Client TTL fields that were not understood and were ignored.",
                       "field")
    if counter is not None:
        counter.labels(field=field).inc()
    _once("invalid", field, logging.WARNING,
          "continuum: ignoring an invalid %s in a request (served as if absent; counted in "
          "continuum_client_hints_invalid_total)")


def server_tool_parser(args) -> str | None:
    """The server's `--tool-call-parser`, if the scheduler reads its format
    (passed on per request); logged once either way."""
    name = getattr(args, "tool_call_parser", None)
    if name is None:
        return None
    known = known_parser(name)
    if known:
        logger.info("continuum: passing the server's --tool-call-parser %s to the scheduler with "
                    "each request that offers tools", known)
    else:
        logger.warning(
            "continuum: --tool-call-parser %s: the scheduler does not read this format; its "
            "tool-call turns are pinned only by tool_call_tokens or tool_call_patterns, forced "
            "calls and the continuum_tool hint", name)
    return known


def failed(exc: BaseException) -> None:
    _once("error", type(exc).__name__, logging.WARNING,
          "continuum: a request was passed on unread (%s); sessions and TTLs of such requests "
          "are not recognised", repr(exc))


def _once(kind: str, key: str, level: int, message: str, *args: object) -> None:
    if (kind, key) in _logged:
        return
    _logged.add((kind, key))
    logger.log(level, message, *(args or (key,)))
