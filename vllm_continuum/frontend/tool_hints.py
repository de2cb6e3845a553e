"""What a request tells about the tool call its turn will end in.

The engine core reads a turn's tool call from its output tokens
(core/tool_calls/). Two things it cannot see there, the API server can:

- **a forced call**: `tool_choice` `"required"` or a named tool
  (`{"type": "function", "function": {"name": ...}}` on chat completions,
  `{"type": "function", "name": ...}` on responses; `{"type": "any"}` or
  `{"type": "tool", "name": ...}` on `/v1/messages`). vLLM makes the call
  under guided decoding, which for some parsers writes bare JSON with no
  marker. A named tool is passed as `continuum_tool`, `"required"` as
  `continuum_tool_choice: "required"` (the engine reads the name from the
  output's JSON);
- **the server's `--tool-call-parser`** (`app.state.args`), for formats the
  vocabulary does not show (text formats, spelled markers): passed as
  `continuum_tool_parser`, when vLLM will parse this request's output for
  calls (it offers tools and does not forbid them).

Each hint only changes how this request's own output is read; a client can
send the same itself, and hurts nobody but itself by lying.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_continuum.core.hints import FORCED, TOOL_CHOICE_KEY, TOOL_KEY, TOOL_PARSER_KEY
from vllm_continuum.core.tool_calls.families import PARSERS


def known_parser(name: object) -> str | None:
    """`name` if the scheduler reads that vLLM parser's format, else None."""
    return name if isinstance(name, str) and name in PARSERS else None


def tool_hints(body: Mapping, parser: str | None) -> dict[str, object]:
    """The hints a request's `tools` and `tool_choice` give (none without tools)."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return {}
    choice = body.get("tool_choice")
    if choice == "none" or isinstance(choice, Mapping) and choice.get("type") == "none":
        return {}
    hints: dict[str, object] = {TOOL_PARSER_KEY: parser} if parser else {}
    if choice == FORCED or isinstance(choice, Mapping) and choice.get("type") == "any":
        hints[TOOL_CHOICE_KEY] = FORCED
    elif isinstance(choice, Mapping) and (name := _forced_name(choice)):
        hints[TOOL_KEY] = name
    return hints


def _forced_name(choice: Mapping) -> str | None:
    function = choice.get("function")
    name = function.get("name") if isinstance(function, Mapping) else choice.get("name")
    return name if isinstance(name, str) and name else None
