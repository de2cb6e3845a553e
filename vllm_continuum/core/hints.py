"""Per-request hints, read from `vllm_xargs` (vLLM's `sampling_params.extra_args`).

Hints come from untrusted clients. Each one is validated on its own: a bad
value is dropped (named in `invalid`, so it can be logged and counted) and
the request goes on as if the hint were absent. Nothing here raises.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from vllm_continuum.core.tool_calls.families import PARSERS

TOOL_KEY = "continuum_tool"
TTL_KEY = "continuum_ttl_s"
LAST_TURN_KEY = "continuum_last_turn"
# What the middleware knows of a request's tool call: the server's own
# --tool-call-parser (text formats), and that the request forces a call
# (`tool_choice: required`; a named tool comes as `continuum_tool`). Each
# only changes how this request's own output is read.
TOOL_PARSER_KEY = "continuum_tool_parser"
TOOL_CHOICE_KEY = "continuum_tool_choice"
FORCED = "required"
# vLLM's own session id travels as the body's `session_id` or this header
# (routers hash the header to keep a session's turns on one instance).
SESSION_HEADER = "X-Session-ID"


@dataclass(frozen=True)
class Hints:
    tool: str | None = None
    ttl_s: float | None = None
    last_turn: bool = False
    tool_parser: str | None = None  # a vLLM tool parser's name (core/tool_calls/families.py)
    tool_forced: bool = False  # the request forces a tool call
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

    parser = extra_args.get(TOOL_PARSER_KEY)
    if parser is not None and not (isinstance(parser, str) and parser in PARSERS):
        invalid.append(TOOL_PARSER_KEY)
        parser = None

    choice = extra_args.get(TOOL_CHOICE_KEY)
    if choice is not None and choice != FORCED:
        invalid.append(TOOL_CHOICE_KEY)

    forced = choice == FORCED
    if tool is None and ttl is None and not last_turn and parser is None and not forced and not invalid:
        return NO_HINTS
    return Hints(tool=tool, ttl_s=ttl, last_turn=last_turn, tool_parser=parser, tool_forced=forced,
                 invalid=tuple(invalid))


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
