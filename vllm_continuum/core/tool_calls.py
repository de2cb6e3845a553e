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
when plain-text patterns are configured, and (with a byte-level BPE
tokenizer) only if one of their tokens spells a character every match needs
(the default pattern's backtick).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

logger = logging.getLogger("vllm.continuum")

try:  # the regex parser, to find characters every match must contain
    from re import _constants as _sre_constants, _parser as _sre_parser  # Python >= 3.11
except ImportError:  # pragma: no cover  (Python 3.10)
    import sre_constants as _sre_constants
    import sre_parse as _sre_parser

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

    def required_chars(self) -> frozenset[str] | None:
        """Characters of which every match of any pattern contains one (each
        pattern's first literal at its top level), if each pattern has one in
        printable ASCII; else None (nothing is known)."""
        chars = set()
        for pattern in self._patterns:
            char = _required_char(pattern)
            if char is None:
                return None
            chars.add(char)
        return frozenset(chars)

    def match(self, text: str) -> str | None:
        """The tool named by the first configured pattern that matches, else None."""
        for pattern in self._patterns:
            found = pattern.search(text)
            if found:
                return (found.group(1) or UNKNOWN_TOOL)[:128]
        return None


def _required_char(pattern: re.Pattern) -> str | None:
    """A printable ASCII character every match of `pattern` contains: a literal
    at its top level (not in a group, branch or repeat), case-sensitive."""
    try:
        parsed = _sre_parser.parse(pattern.pattern, pattern.flags)
    except Exception:  # noqa: BLE001  (a private parser: nothing known, nothing skipped)
        return None
    if parsed.state.flags & re.IGNORECASE:
        return None
    for op, value in parsed:
        if op is _sre_constants.LITERAL and 0x21 <= value <= 0x7E:
            return chr(value)
    return None


def tokens_spelling(tokenizer, chars: frozenset[str]) -> frozenset[int] | None:
    """Ids of the tokens whose text may hold one of `chars` (printable ASCII),
    where that is exact: a byte-level BPE tokenizer (Qwen, Llama 3, GPT-2 and
    the like), whose decoding joins each token's bytes (printable ASCII is
    spelled as itself in its vocabulary) and added tokens' text, so that a
    decoded output holds such a character only if one of its tokens does.
    None for other tokenizers (nothing known)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if type(decoder).__name__ != "ByteLevel":
        return None
    try:
        vocab = tokenizer.get_vocab()  # added tokens included, by their text
    except Exception:  # noqa: BLE001
        return None
    return frozenset(i for token, i in vocab.items() if not chars.isdisjoint(token))


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
        # The tokens without which no pattern can match the decoded output: an
        # output holding none of them is not decoded (None: always decoded).
        chars = self._reader.required_chars() if self._reader.has_patterns and tokenizer else None
        self._may_match = tokens_spelling(tokenizer, chars) if chars else None
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
            if self._may_match is not None and self._may_match.isdisjoint(output):
                return None  # no pattern can match: nothing to decode
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
