"""Tool calls in plain text, by regexes: agents that call tools in their
reply's text (mini-swe-agent's fenced command block, by default: config.py) and the
operator's own `tool_call_patterns`. Each pattern has one group, the tool's
name. They are searched in the whole decoded output, so an output is decoded
only if one of its tokens spells a character every match needs
(`vocabulary.tokens_spelling`; without a readable vocabulary, always).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

try:  # the regex parser, to find characters every match must contain
    from re import _constants as _sre_constants, _parser as _sre_parser  # Python >= 3.11
except ImportError:  # pragma: no cover  (Python 3.10)
    import sre_constants as _sre_constants
    import sre_parse as _sre_parser

UNKNOWN_TOOL = "unknown"


class TextPatterns:
    def __init__(self, patterns: Sequence[str] = ()) -> None:
        self._patterns = [re.compile(p) for p in dict.fromkeys(patterns)]

    def __bool__(self) -> bool:
        return bool(self._patterns)

    def __len__(self) -> int:
        return len(self._patterns)

    def required_chars(self) -> frozenset[str] | None:
        """Characters of which every match of any pattern contains one (each
        pattern's first literal at its top level), if each pattern has one in
        printable ASCII; else None (nothing is known)."""
        chars = set()
        for pattern in self._patterns:
            char = required_char(pattern)
            if char is None:
                return None
            chars.add(char)
        return frozenset(chars)

    def match(self, text: str) -> str | None:
        """The tool named by the first pattern that matches, else None."""
        for pattern in self._patterns:
            found = pattern.search(text)
            if found:
                return (found.group(1) or UNKNOWN_TOOL)[:128]
        return None


def required_char(pattern: re.Pattern) -> str | None:
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
