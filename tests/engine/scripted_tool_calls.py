"""Test-only logit steering: the tiny Kimi-K2 model writes Kimi K2's own tool calls.

Loaded with vLLM's `--logits-processors` on a server of the tiny model built
as Kimi K2 (`build_tiny_model(family="kimi_k2")`: Kimi's tokens, as special
tokens, and its chat template). A random model calls no tool, so for each
request that offers tools this processor makes the model write, token by
token, what a trained Kimi K2 writes:

- when the conversation's last message is the user's: a call of the first
  offered tool it knows (`ARGUMENTS`), in Kimi's format
  `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>`;
- when it is a tool's result: a short answer.

Everything else is real: the engine and its scheduler (with no continuum
setting), the tokenizer, the chat template, vLLM's structured outputs (the
call satisfies the `kimi` structural tag vLLM builds for the request) and
`--tool-call-parser kimi_k2`, which turns the text into `tool_calls` for the
client. It adds no hint: the scheduler must see the call in the tokens.
Requests without tools (the pool-cycling traffic) are not touched.
"""

from __future__ import annotations

import json

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

# The tools it knows how to call, in the order it prefers them, and their arguments.
ARGUMENTS = {"get_weather": {"city": "Paris"}, "get_goal": {}, "Glob": {"pattern": "*"}}
ANSWER = "Done: the tool answered."
DECLARE, END = "<|im_system|>tool_declare<|im_middle|>", "<|im_end|>"
TOOL_RESULT, USER = "<|im_system|>tool<|im_middle|>", "<|im_user|>"


def call_text(name: str, arguments: dict) -> str:
    args = json.dumps(arguments, separators=(",", ":"))
    return (f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:0"
            f"<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|>")


def script_for(prompt: str) -> str | None:
    """What the model is to write after `prompt` (the rendered conversation)."""
    start = prompt.find(DECLARE)
    if start < 0:
        return None  # no tools offered
    declared = prompt[start + len(DECLARE):prompt.find(END, start)]
    names = [t.get("function", t).get("name") for t in json.loads(declared)]
    if prompt.rfind(TOOL_RESULT) > prompt.rfind(USER):
        return ANSWER
    name = next((n for n in ARGUMENTS if n in names), None)
    return call_text(name, ARGUMENTS[name]) if name else None


class ScriptedToolCalls(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        from vllm.tokenizers import cached_tokenizer_from_config

        self.tokenizer = cached_tokenizer_from_config(vllm_config.model_config)
        self.end = self.tokenizer.get_vocab()[END]
        self.steered: dict[int, tuple[list[int], list[int]]] = {}  # row -> (script, output so far)

    def is_argmax_invariant(self) -> bool:
        return False

    def _script(self, params, prompt_ids, output_ids):
        if not prompt_ids:
            return None
        text = script_for(self.tokenizer.decode(prompt_ids))
        if text is None:
            return None
        return [*self.tokenizer.encode(text, add_special_tokens=False), self.end], output_ids

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.steered, batch_update, self._script)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (script, output) in self.steered.items():
            token = script[len(output)] if len(output) < len(script) else self.end
            allowed = logits[row, token].item()  # -inf: structured outputs forbid it
            if allowed != float("-inf"):
                logits[row] = float("-inf")
                logits[row, token] = 0.0
        return logits
