"""Reading the called tool out of a finished turn's text.

Hermes-style models write `<tool_call>{"name": "search", "arguments": ...}`;
the scheduler finds the `<tool_call>` token and reads the name from the JSON
after it. Agents that call tools in plain text (a shell agent's fenced
command, say) are recognised by configured regexes whose one group is the
tool name. The name only selects a duration history and a TTL, so anything
unreadable becomes `unknown`, never an error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

UNKNOWN_TOOL = "unknown"
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
