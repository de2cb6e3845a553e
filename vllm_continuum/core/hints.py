"""Per-request hints, read from `vllm_xargs` (vLLM's `sampling_params.extra_args`).

Hints come from untrusted clients. Each one is validated on its own: a bad
value is dropped (named in `invalid`, so it can be logged and counted) and
the request goes on as if the hint were absent. Nothing here raises.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

TOOL_KEY = "continuum_tool"
TTL_KEY = "continuum_ttl_s"
LAST_TURN_KEY = "continuum_last_turn"
# vLLM's own session id travels as the body's `session_id` or this header
# (routers hash the header to keep a session's turns on one instance).
SESSION_HEADER = "X-Session-ID"


@dataclass(frozen=True)
class Hints:
    tool: str | None = None
    ttl_s: float | None = None
    last_turn: bool = False
    invalid: tuple[str, ...] = field(default=())


NO_HINTS = Hints()


def parse_hints(extra_args: Mapping[str, object] | None, max_tool_name_length: int) -> Hints:
    if not extra_args or not isinstance(extra_args, Mapping):
        return NO_HINTS
    invalid: list[str] = []

    tool = extra_args.get(TOOL_KEY)
    if tool is not None and not (
        isinstance(tool, str) and 0 < len(tool) <= max_tool_name_length and tool.isprintable()
    ):
        invalid.append(TOOL_KEY)
        tool = None

    ttl = extra_args.get(TTL_KEY)
    if ttl is not None:
        ttl = _as_ttl(ttl)
        if ttl is None:
            invalid.append(TTL_KEY)

    last = extra_args.get(LAST_TURN_KEY)
    last_turn = False
    if last is not None:
        if isinstance(last, bool) or (isinstance(last, int) and last in (0, 1)):
            last_turn = bool(last)
        elif isinstance(last, str) and last.lower() in ("0", "1", "true", "false"):
            last_turn = last.lower() in ("1", "true")
        else:
            invalid.append(LAST_TURN_KEY)

    if tool is None and ttl is None and not last_turn and not invalid:
        return NO_HINTS
    return Hints(tool=tool, ttl_s=ttl, last_turn=last_turn, invalid=tuple(invalid))


def _as_ttl(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None
