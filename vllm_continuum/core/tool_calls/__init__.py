"""Reading, from a finished turn's output token ids, whether it ended in a
tool call, which tool it called and in which format.

The engine core has the tokenizer, so the scheduler needs no help from the
API server, where vLLM's tool parser runs: every known format's markers are
looked up in the vocabulary once (families.py, vocabulary.py), and each
finished session turn's ids are scanned against them (detector.py). Text
formats need vLLM's parser name (`tool_call_parser`, or the middleware's
per-request hint), plain-text agents a regex (patterns.py); startup.py says
at start which of them the served model gets. The name only selects a
duration history and a TTL: anything unreadable is `unknown`, never an error.
"""

from vllm_continuum.core.tool_calls.detector import NAME_TOKENS, ToolCall, ToolCallDetector
from vllm_continuum.core.tool_calls.families import FAMILIES, PARSERS, TEXT_FORMATS
from vllm_continuum.core.tool_calls.patterns import UNKNOWN_TOOL, TextPatterns
from vllm_continuum.core.tool_calls.startup import describe
from vllm_continuum.core.tool_calls.vocabulary import vocab_token_id

__all__ = [
    "FAMILIES", "NAME_TOKENS", "PARSERS", "TEXT_FORMATS", "UNKNOWN_TOOL",
    "TextPatterns", "ToolCall", "ToolCallDetector", "describe", "vocab_token_id",
]
