"""What to add to one request so that vLLM sees its client's session and TTL.

`plan_request` is the whole decision, without I/O: given the path, the
headers and the body bytes, it returns the session to pass on as vLLM's
`X-Session-ID` header and, only when a hint is added, the new body. The
body is changed in one way only: `continuum_ttl_s` / `continuum_last_turn`
are added to `vllm_xargs` (created if absent) unless the client set them.
A body that is not a JSON object, or whose `vllm_xargs` is not an object,
is never changed (vLLM answers it exactly as without the plugin).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vllm_continuum.core.hints import LAST_TURN_KEY, TTL_KEY
from vllm_continuum.frontend.sessions import Session, find_session, has_vllm_session
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
    headers: Mapping[str, str], raw_body: bytes, sources: Sequence[str], read_ttls: bool
) -> Plan:
    """The session and hints of one request to a generation endpoint.
    `headers` has lower-case names."""
    body = parse_body(raw_body)
    session = None if has_vllm_session(headers, body) else find_session(sources, headers, body)
    lifetime = read_lifetime(body) if read_ttls else Lifetime()
    return Plan(session, _with_hints(body, lifetime), lifetime)


def _with_hints(body: object, lifetime: Lifetime) -> bytes | None:
    hints: dict[str, object] = {}
    if lifetime.ttl_s is not None:
        hints[TTL_KEY] = lifetime.ttl_s
    if lifetime.last_turn:
        hints[LAST_TURN_KEY] = 1
    if not hints or not isinstance(body, dict):
        return None
    xargs = body.get("vllm_xargs")
    if xargs is None:
        xargs = {}
    elif not isinstance(xargs, dict):
        return None
    added = {k: v for k, v in hints.items() if k not in xargs}
    if not added:
        return None
    body = {**body, "vllm_xargs": {**xargs, **added}}
    # ASCII escapes keep any string the client sent (lone surrogates too) intact.
    return json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode()
