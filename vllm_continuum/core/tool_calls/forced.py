"""What the engine core can know of a forced tool call without the middleware.

A request that forces a call (`tool_choice: "required"` or a named tool on
`/v1/chat/completions` and `/v1/responses`; `{"type": "any"}` or
`{"type": "tool"}` on `/v1/messages`) reaches the engine core with the
constraint vLLM derived from it in `sampling_params.structured_outputs`:

- **a structural tag** (`structural_tag`; vLLM's default for parsers with
  one, `VLLM_ENFORCE_STRICT_TOOL_CALLING`, e.g. hermes, kimi_k2, deepseek,
  glm, qwen3_coder, minimax, llama, openai): the output is the family's own
  call, markers included (spelled out of ordinary tokens, sometimes), which
  the detector reads as any other call;
- **`required` as guided JSON** (`json`, from `ToolParser.adjust_request`,
  for parsers without a structural tag): a list of `{"name", "parameters"}`
  objects whose schema names every tool (`"name": {"enum": [NAME]}` per
  tool, `is_required_schema` below); the output has no marker, and the
  tool is read from its first `"name"`;
- **a named tool as guided JSON**: the schema is the tool's parameters
  alone, which nothing tells from a client's own `response_format`; the
  output is the bare arguments. Only the middleware (which sees the
  request's `tool_choice` and sends the tool as `continuum_tool`) makes
  such a turn a call.
"""

from __future__ import annotations

from collections.abc import Mapping


def is_required_schema(schema: object) -> bool:
    """Whether a guided-JSON schema is the one vLLM builds for
    `tool_choice: "required"` (vllm/tool_parsers/utils.py,
    `_get_json_schema_from_tools`): an array of at least one object, each
    branch of its `anyOf` a tool, named by a one-value enum."""
    if not isinstance(schema, Mapping) or schema.get("type") != "array":
        return False
    items = schema.get("items")
    branches = items.get("anyOf") if isinstance(items, Mapping) else None
    if schema.get("minItems") != 1 or not isinstance(branches, list) or not branches:
        return False
    return all(_names_one_tool(branch) for branch in branches)


def _names_one_tool(branch: object) -> bool:
    if not isinstance(branch, Mapping) or not isinstance(branch.get("properties"), Mapping):
        return False
    name = branch["properties"].get("name")
    return (isinstance(name, Mapping) and isinstance(name.get("enum"), list)
            and len(name["enum"]) == 1 and isinstance(name["enum"][0], str))
