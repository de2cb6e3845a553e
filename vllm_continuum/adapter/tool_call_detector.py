"""Which tool a finished turn called, read from its output token ids.

The engine core has the tokenizer, so the scheduler needs no help from the
API server (where vLLM's tool parser runs): it looks for the tool-call token
and decodes only the few tokens after it to read the name. Outputs without
the token are decoded whole only when plain-text patterns are configured.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm.logger import init_logger

from vllm_continuum.core.tool_calls import UNKNOWN_TOOL, ToolCallReader

logger = init_logger("vllm.continuum")

_NAME_TOKENS = 64  # enough for `{"name": "<128 chars>"` in any tokenizer


class ToolCallDetector:
    def __init__(self, tokenizer, tool_call_token: str, patterns: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._reader = ToolCallReader(patterns)
        self.token_id = self._resolve(tool_call_token)

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
        except Exception:  # a tokenizer quirk must never fail a request
            logger.debug("continuum: could not decode a finished output", exc_info=True)
            return ""

    def _resolve(self, token: str) -> int | None:
        if self._tokenizer is None:
            logger.warning(
                "continuum: no tokenizer in the engine core (skip_tokenizer_init?); "
                "tool calls are recognised only by the continuum_tool hint."
            )
            return None
        token_id = self._tokenizer.get_vocab().get(token)
        if token_id is None:
            logger.warning(
                "continuum: the tokenizer has no %r token; tool calls are recognised "
                "only by the continuum_tool hint. Set CONTINUUM_TOOL_CALL_TOKEN to the "
                "model's tool-call token.",
                token,
            )
        return token_id
