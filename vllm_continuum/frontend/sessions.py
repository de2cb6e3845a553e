"""Which session a request belongs to, from what its client already sends.

vLLM's own spellings come first and are left to vLLM: the body field
`session_id`, the `X-Session-ID` header, `vllm_xargs.session_id`. Only a
request with none of them is looked at here, in the order of the
`client_session_sources` setting: `header:<name>` reads a header
(case-insensitive), `body:<field>` one of `config.CLIENT_BODY_FIELDS`. The first one that
yields an id wins.

`user`, `safety_identifier` and Anthropic's plain `metadata.user_id` name a
user, not a session (one user runs many sessions at once): never read.
Claude Code's `metadata.user_id` is read only when it carries a session:
a JSON object string with `session_id`, or the older `..._session_<id>`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

VLLM_HEADER = "x-session-id"
MAX_ID_LENGTH = 256
_USER_ID_SESSION = re.compile(r"(?:^|_)session_([A-Za-z0-9][A-Za-z0-9-]{7,127})$")


@dataclass(frozen=True)
class Session:
    id: str
    source: str  # the `client_session_sources` entry it came from


def has_vllm_session(headers: Mapping[str, str], body: object) -> bool:
    """Whether vLLM's own session path will find an id (then nothing is added)."""
    if headers.get(VLLM_HEADER):
        return True
    if not isinstance(body, Mapping):
        return False
    if body.get("session_id"):
        return True
    xargs = body.get("vllm_xargs")
    return isinstance(xargs, Mapping) and bool(xargs.get("session_id"))


def find_session(
    sources: Sequence[str], headers: Mapping[str, str], body: object
) -> Session | None:
    """The first source in `sources` that yields a session id, else None.
    `headers` has lower-case names."""
    for source in sources:
        kind, _, name = source.partition(":")
        if kind == "header":
            raw = headers.get(name.lower())
        else:
            raw = _body_value(name, body) if isinstance(body, Mapping) else None
        session = normalise_id(raw)
        if session:
            return Session(session, source)
    return None


def normalise_id(raw: object) -> str | None:
    """A usable id: printable ASCII up to `MAX_ID_LENGTH` as is; any other
    non-empty string as its SHA-256 (stable, so its turns still match);
    anything else None."""
    if not isinstance(raw, str):
        return None
    value = raw.strip()
    if not value:
        return None
    if len(value) <= MAX_ID_LENGTH and value.isascii() and value.isprintable():
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return f"sha256-{digest[:32]}"


def _body_value(field: str, body: Mapping) -> object:
    if field == "metadata.user_id":
        metadata = body.get("metadata")
        if not isinstance(metadata, Mapping):
            return None
        return session_in_user_id(metadata.get("user_id"))
    value: object = body
    for key in field.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def session_in_user_id(user_id: object) -> str | None:
    """The session Claude Code puts in `metadata.user_id`, else None."""
    if not isinstance(user_id, str) or not user_id:
        return None
    if user_id.lstrip().startswith("{"):
        try:
            parsed = json.loads(user_id)
        except ValueError:
            return None
        value = parsed.get("session_id") if isinstance(parsed, dict) else None
        return value if isinstance(value, str) and value else None
    found = _USER_ID_SESSION.search(user_id)
    return found.group(1) if found else None
