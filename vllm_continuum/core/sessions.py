"""Session ids as the scheduler keys them.

A session id (vLLM's `session_id`: body field, `X-Session-ID` header or
`vllm_xargs`) is a client's claim: it groups requests, and what it is to the
scheduler is decided by the contexts its requests continue (programs.py).
"""

from __future__ import annotations

import hashlib

_MAX_SESSION_KEY_LENGTH = 128


def session_key(session_id: str | None) -> str | None:
    """The session a request belongs to (vLLM's `session_id`), as pins key it.

    Client-chosen ids can be huge; long ones are kept as a fixed-size digest.
    """
    if not session_id or len(session_id) <= _MAX_SESSION_KEY_LENGTH:
        return session_id or None
    return "sha256:" + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()
