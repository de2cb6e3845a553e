"""A two-turn tool-call agent on LiteLLM, configured as its users point it at vLLM.

Run with the LiteLLM venv's Python (`.venv-clients`), not this package's:
    python litellm_agent.py BASE_URL SESSION GATE MESSAGES_JSON
The model is `hosted_vllm/tiny` at `BASE_URL/v1` with a dummy key, and the
conversation id goes as `prompt_cache_key`, as the OpenHands SDK sends it
through LiteLLM. Turn 1 asks for a tool call; the tool "runs" until the GATE
file is gone (`GATE.waiting` says it started); turn 2 sends its result.
Prints one JSON line per turn: prompt and cached tokens, the tool called.
"""

import json
import sys
import time
from pathlib import Path

import litellm

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": [
        "Paris", "Tokyo", "Lima", "Oslo", "Cairo"]}}, "required": ["city"],
        "additionalProperties": False}}}


def ask(base_url, session, messages, **kwargs):
    return litellm.completion(model="hosted_vllm/tiny", api_base=f"{base_url}/v1",
                              api_key="dummy", messages=messages, tools=[WEATHER],
                              prompt_cache_key=session, num_retries=0, timeout=300, **kwargs)


def report(turn, response, tool=None):
    details = getattr(response.usage, "prompt_tokens_details", None)
    print(json.dumps({"turn": turn, "prompt": response.usage.prompt_tokens,
                      "cached": (getattr(details, "cached_tokens", None) or 0) if details else 0,
                      "tool": tool}), flush=True)


def main(base_url, session, gate, messages_json):
    messages = json.loads(Path(messages_json).read_text())
    for seed in range(8):
        first = ask(base_url, session, messages, tool_choice="required",
                    parallel_tool_calls=False, max_tokens=64, temperature=0.7, seed=seed)
        calls = first.choices[0].message.tool_calls
        if calls:
            break
    else:
        sys.exit("no tool call")
    call = calls[0]
    report(1, first, call.function.name)
    Path(gate + ".waiting").touch()
    while Path(gate).exists():
        time.sleep(0.1)
    messages += [{"role": "assistant", "content": None, "tool_calls": [{
        "id": call.id, "type": "function",
        "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'}]
    report(2, ask(base_url, session, messages, tool_choice="none", max_tokens=8))


if __name__ == "__main__":
    main(*sys.argv[1:5])
