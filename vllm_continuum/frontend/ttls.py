"""How long a client asks its context to be kept, and whether this is its last turn.

Read from the request body, translated to seconds:

- Anthropic `cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}` on
  system blocks, messages, their content blocks and tools; without `ttl`
  Anthropic keeps 5 minutes. The longest on the request counts.
- OpenAI `prompt_cache_retention`: `in_memory` / `in-memory` (OpenAI keeps
  such a prefix 5-10 minutes idle: 600 s), `24h` (86,400 s).
- Dynamo `nvext.cache_control.ttl` (a duration such as `"5m"`, or seconds)
  and `nvext.session_control.action: "close"` (the session's last turn).

Their meaning is a cached prefix's lifetime, refreshed on every hit; ours
is how long a paused session's blocks stay pinned waiting for its next
turn, capped by `max_ttl_s`. A value that is not one of these is named in
`invalid` and otherwise ignored: nothing here raises.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

ANTHROPIC_DEFAULT_TTL_S = 300.0
RETENTION_S = {"in_memory": 600.0, "in-memory": 600.0, "24h": 86_400.0}
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
MAX_BLOCKS_SCANNED = 10_000

CACHE_CONTROL = "cache_control.ttl"
RETENTION = "prompt_cache_retention"
NVEXT_TTL = "nvext.cache_control.ttl"
NVEXT_ACTION = "nvext.session_control.action"


@dataclass(frozen=True)
class Lifetime:
    ttl_s: float | None = None
    last_turn: bool = False
    invalid: tuple[str, ...] = ()


def parse_duration(value: object) -> float | None:
    """Seconds from a number of seconds or a string like `"90"`, `"5m"`, `"1h"`."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (found := _DURATION.match(value)):
        seconds = float(found.group(1)) * _UNITS[found.group(2)]
    else:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def read_lifetime(body: object) -> Lifetime:
    """Every TTL and last-turn signal in a request body, combined."""
    if not isinstance(body, Mapping):
        return Lifetime()
    ttls: list[float] = []
    invalid: list[str] = []

    def take(ttl: float | None, name: str) -> None:
        if ttl is None:
            invalid.append(name)
        else:
            ttls.append(ttl)

    for control in _cache_controls(body):
        take(_anthropic_ttl(control), CACHE_CONTROL)
    if (retention := body.get("prompt_cache_retention")) is not None:
        take(RETENTION_S.get(retention) if isinstance(retention, str) else None, RETENTION)
    nvext = body.get("nvext")
    last_turn = False
    if isinstance(nvext, Mapping):
        control = nvext.get("cache_control")
        if isinstance(control, Mapping) and control.get("ttl") is not None:
            take(parse_duration(control["ttl"]), NVEXT_TTL)
        session = nvext.get("session_control")
        if isinstance(session, Mapping) and session.get("action") is not None:
            action = session["action"]
            if action not in ("open", "close"):
                invalid.append(NVEXT_ACTION)
            last_turn = action == "close"
    return Lifetime(max(ttls) if ttls else None, last_turn, tuple(dict.fromkeys(invalid)))


def _anthropic_ttl(control: object) -> float | None:
    if not isinstance(control, Mapping) or control.get("type", "ephemeral") != "ephemeral":
        return None
    if control.get("ttl") is None:
        return ANTHROPIC_DEFAULT_TTL_S
    return parse_duration(control["ttl"])


def _cache_controls(body: Mapping):
    """The `cache_control` objects where Anthropic (and LiteLLM's chat form) put them."""
    seen = 0
    for item in _blocks(body):
        seen += 1
        if seen > MAX_BLOCKS_SCANNED:
            return
        if item.get("cache_control") is not None:
            yield item["cache_control"]


def _blocks(body: Mapping):
    for key in ("system", "tools", "messages"):
        items = body.get(key)
        if not isinstance(items, list):
            continue
        for item in items:
            if not isinstance(item, Mapping):
                continue
            yield item
            content = item.get("content") if key == "messages" else None
            if isinstance(content, list):
                yield from (part for part in content if isinstance(part, Mapping))
