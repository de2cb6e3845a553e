"""The tool-call pause, end to end against a live OpenAI-compatible server.

Session A's first turn ends in a parsed tool call. While "the tool runs",
other sessions' traffic passes through the KV cache, more than the free
pool holds, so an LRU cache evicts A's blocks. Then A's second turn (its
history plus the tool result) arrives. The figure that matters is how much
of the second turn's prompt the server found cached: with pinning, every
full block of the first turn's prompt; without it, little or nothing.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from openai import OpenAI

from vllm_continuum.core.hints import LAST_TURN_KEY

CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo"]


def city_tool(name: str, description: str) -> dict:
    """A strict function of one enum argument: what a random-weight model can
    call reliably under guided decoding (free strings may never close)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": CITIES}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }


WEATHER_TOOL = city_tool("get_weather", "Current weather of a city.")
_WORDS = (
    "agent cache token block memory latency tool call weather report city "
    "forecast river mountain planner schedule answer request context prefix "
    "history result server engine model session turn queue pin evict"
).split()


@dataclass(frozen=True)
class PauseResult:
    flavour: str
    tool_called: str
    turn1_prompt_tokens: int
    turn2_prompt_tokens: int
    turn2_cached_tokens: int
    block_size: int

    @property
    def turn1_full_block_tokens(self) -> int:
        """What a resumed turn can reuse at most: turn 1's prompt in whole blocks."""
        return self.turn1_prompt_tokens // self.block_size * self.block_size

    @property
    def reuse(self) -> float:
        return self.turn2_cached_tokens / max(1, self.turn1_full_block_tokens)


def filler_text(rng: random.Random, words: int) -> str:
    """A user's notes: random words, so that prompts span several KV blocks."""
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def cached_tokens(usage) -> int:
    """vLLM's usage.prompt_tokens_details.cached_tokens (0 when absent)."""
    details = getattr(usage, "prompt_tokens_details", None)
    return (getattr(details, "cached_tokens", None) or 0) if details else 0


def first_turn(client: OpenAI, messages: list[dict], session_id: str, seed: int, tries: int = 4):
    """Ask for a tool call; a random-weight model sometimes fails, so retry."""
    for attempt in range(tries):
        response = client.chat.completions.create(
            model="tiny",
            messages=messages,
            tools=[WEATHER_TOOL],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=64,
            temperature=0.7,
            seed=seed + attempt,
            extra_body={"session_id": session_id},
        )
        message = response.choices[0].message
        if message.tool_calls:
            return response
    raise RuntimeError(f"no parsed tool call after {tries} tries: {message!r}")


def churn(client: OpenAI, *, requests: int, tokens: int, vocab: int, seed: int) -> None:
    """Other traffic: distinct token-id prompts, one after another."""
    rng = random.Random(seed)
    for _ in range(requests):
        prompt = [rng.randrange(300, vocab - 300) for _ in range(tokens)]
        client.completions.create(model="tiny", prompt=prompt, max_tokens=1)


def run_pause_scenario(
    base_url: str,
    flavour: str,
    *,
    block_size: int = 32,
    document_words: int = 200,
    churn_requests: int = 4,
    churn_tokens: int = 800,
    vocab: int = 2000,
    tool_seconds: float = 0.5,
    seed: int = 0,
) -> PauseResult:
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=120, max_retries=0)
    rng = random.Random(seed)
    session_id = f"pause-demo-{seed}-{flavour}"
    messages: list[dict] = [
        {"role": "system", "content": "You are a travel agent. Use tools to check the weather."},
        {
            "role": "user",
            "content": "Notes for the trip: " + filler_text(rng, document_words)
            + "\nWhat is the weather in the first city we visit?",
        },
    ]
    t1 = first_turn(client, messages, session_id, seed)
    call = t1.choices[0].message.tool_calls[0]

    started = time.monotonic()
    churn(client, requests=churn_requests, tokens=churn_tokens, vocab=vocab, seed=seed + 1)
    time.sleep(max(0.0, tool_seconds - (time.monotonic() - started)))

    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear", "celsius": 21}'},
    ]
    t2 = client.chat.completions.create(
        model="tiny",
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_tokens=8,
        seed=seed,
        extra_body={"session_id": session_id, "vllm_xargs": {LAST_TURN_KEY: 1}},
    )
    return PauseResult(
        flavour=flavour,
        tool_called=call.function.name,
        turn1_prompt_tokens=t1.usage.prompt_tokens,
        turn2_prompt_tokens=t2.usage.prompt_tokens,
        turn2_cached_tokens=cached_tokens(t2.usage),
        block_size=block_size,
    )
