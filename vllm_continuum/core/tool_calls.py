"""Reading the called tool out of a finished turn.

Hermes-style models write `<tool_call>{"name": "search", "arguments": ...}`;
the scheduler finds the `<tool_call>` token and reads the name from the JSON
after it. Agents that call tools in plain text (a shell agent's fenced
command, say) are recognised by configured regexes whose one group is the
tool name. The name only selects a duration history and a TTL, so anything
unreadable becomes `unknown`, never an error.

The engine core has the tokenizer, so the scheduler needs no help from the
API server (where vLLM's tool parser runs): `ToolCallDetector` looks for the
tool-call token in the output token ids and decodes only the few tokens
after it to read the name. Outputs without the token are decoded whole only
when plain-text patterns are configured.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

logger = logging.getLogger("vllm.continuum")

UNKNOWN_TOOL = "unknown"
_NAME_TOKENS = 64  # enough for `{"name": "<128 chars>"` in any tokenizer
_HERMES_NAME = re.compile(r'"name"\s*:\s*"([^"\\]{1,128})"')


def tool_name_from_text(text: str) -> str:
    match = _HERMES_NAME.search(text)
    return match.group(1) if match else UNKNOWN_TOOL


class ToolCallReader:
    def __init__(self, patterns: Sequence[str] = ()) -> None:
        self._patterns = [re.compile(p) for p in patterns]

    @property
    def has_patterns(self) -> bool:
        return bool(self._patterns)

    def name_after_token(self, text: str) -> str:
        return tool_name_from_text(text)

    def match(self, text: str) -> str | None:
        """The tool named by the first configured pattern that matches, else None."""
        for pattern in self._patterns:
            found = pattern.search(text)
            if found:
                return (found.group(1) or UNKNOWN_TOOL)[:128]
        return None


def vocab_token_id(tokenizer, token: str) -> int | None:
    """`token`'s id in the tokenizer's vocabulary; None if absent or unreadable."""
    if tokenizer is None:
        return None
    try:
        return tokenizer.get_vocab().get(token)
    except Exception:  # noqa: BLE001  (a tokenizer quirk must not break the engine)
        return None


class ToolCallDetector:
    def __init__(self, tokenizer, tool_call_token: str, patterns: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._reader = ToolCallReader(patterns)
        self.token_id = vocab_token_id(tokenizer, tool_call_token)
        if tokenizer is None:
            logger.warning(
                "continuum: no tokenizer in the engine core (skip_tokenizer_init?); "
                "tool calls are recognised only by the continuum_tool hint."
            )
        elif self.token_id is None:
            logger.warning(
                "continuum: the tokenizer has no %r token; tool calls are recognised "
                "only by the continuum_tool hint. Set tool_call_token to the model's "
                "tool-call token.",
                tool_call_token,
            )

    def tool_called(self, output_token_ids: Sequence[int]) -> str | None:
        """The tool the output calls, `unknown` if unreadable, None if no call."""
        output = list(output_token_ids)
        if self.token_id is not None and self.token_id in output:
            start = output.index(self.token_id) + 1
            text = self._decode(output[start : start + _NAME_TOKENS])
            return self._reader.name_after_token(text) if text else UNKNOWN_TOOL
        if self._reader.has_patterns:
            return self._reader.match(self._decode(output))
        return None

    def _decode(self, token_ids: list[int]) -> str:
        if self._tokenizer is None:
            return ""
        try:
            return self._tokenizer.decode(token_ids)
        except Exception:  # noqa: BLE001  (a tokenizer quirk must never fail a request)
            logger.debug("continuum: could not decode a finished output", exc_info=True)
            return ""
