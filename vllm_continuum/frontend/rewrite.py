"""What to add to one request so that vLLM sees its client's session, TTL and
tool call.

`plan_request` is the whole decision, without I/O: given the headers and the
body bytes, it returns the session to pass on as vLLM's `X-Session-ID`
header and, only when a hint is added, the new body. The body is changed in
one way only: hints (`continuum_ttl_s`, `continuum_last_turn`, the tool
hints of tool_hints.py) are added to `vllm_xargs` unless the client set
them. A body that is not a JSON object, or whose `vllm_xargs` is not an
object, is never changed (vLLM answers it exactly as without the plugin).

The hints are spliced into the body's bytes, not written by serialising the
whole body again: `"vllm_xargs": {...}` goes in before the object's closing
brace, after every key the client sent. JSON objects keep the last of
duplicate keys (Python's `json`, which vLLM's FastAPI routes parse with), so
a client's own `vllm_xargs` is replaced by itself plus the hints. Adding
hints costs a copy of the body: 1-4% of parsing it, measured at 77 KB and
1.8 MB (`vllm-continuum middleware-bench`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vllm_continuum.core.hints import LAST_TURN_KEY, TTL_KEY
from vllm_continuum.frontend.sessions import Session, find_session, has_vllm_session
from vllm_continuum.frontend.tool_hints import tool_hints
from vllm_continuum.frontend.ttls import Lifetime, read_lifetime

# The generation endpoints of vLLM's OpenAI and Anthropic servers: every
# one takes `vllm_xargs` and reads `X-Session-ID`.
PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"})
MAX_BODY_BYTES = 32 * 1024 * 1024  # larger bodies are passed on unread


@dataclass(frozen=True)
class Plan:
    session: Session | None = None
    body: bytes | None = None  # the new body; None: unchanged
    lifetime: Lifetime = Lifetime()


NOTHING = Plan()


def parse_body(raw: bytes) -> object:
    """The JSON body, or None when it is not JSON (it is then passed on as is)."""
    if not raw or len(raw) > MAX_BODY_BYTES:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


def plan_request(
    headers: Mapping[str, str], raw_body: bytes, sources: Sequence[str], read_ttls: bool,
    tool_parser: str | None = None,
) -> Plan:
    """The session and hints of one request to a generation endpoint.
    `headers` has lower-case names; `tool_parser`: the server's
    `--tool-call-parser`, if the scheduler reads its format."""
    body = parse_body(raw_body)
    session = None if has_vllm_session(headers, body) else find_session(sources, headers, body)
    lifetime = read_lifetime(body) if read_ttls else Lifetime()
    if not isinstance(body, dict):
        return Plan(session, None, lifetime)
    hints = {**_lifetime_hints(lifetime), **tool_hints(body, tool_parser)}
    return Plan(session, splice_hints(raw_body, body, hints), lifetime)


def _lifetime_hints(lifetime: Lifetime) -> dict[str, object]:
    hints: dict[str, object] = {}
    if lifetime.ttl_s is not None:
        hints[TTL_KEY] = lifetime.ttl_s
    if lifetime.last_turn:
        hints[LAST_TURN_KEY] = 1
    return hints


def splice_hints(raw: bytes, body: dict, hints: Mapping[str, object]) -> bytes | None:
    """`raw` (the JSON object `body` was parsed from) with `hints` added to its
    `vllm_xargs`, unless the client set them; None if nothing is added."""
    xargs = body.get("vllm_xargs", {})
    if not hints or not isinstance(xargs, dict):
        return None
    added = {k: v for k, v in hints.items() if k not in xargs}
    if not added:
        return None
    end = len(raw) - 1
    while raw[end] in b" \t\r\n":  # JSON's whitespace after the closing brace
        end -= 1
    if raw[end] != ord("}") or raw[end - 1] == 0:  # not UTF-8 (json reads UTF-16 and -32 too)
        return None
    # ASCII escapes keep any string the client sent (lone surrogates too) intact.
    value = json.dumps({**xargs, **added}, ensure_ascii=True, separators=(",", ":"))
    key = b',"vllm_xargs":' if body else b'"vllm_xargs":'
    view = memoryview(raw)
    return b"".join((view[:end], key, value.encode(), view[end:]))
