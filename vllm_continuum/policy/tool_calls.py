"""Reading a tool name out of a finished turn's text.

Hermes-style models write `<tool_call>{"name": "search", "arguments": ...}`.
The name only selects a TTL, so anything unreadable becomes `unknown`
rather than an error.
"""

from __future__ import annotations

import re

UNKNOWN_TOOL = "unknown"
_NAME = re.compile(r'"name"\s*:\s*"([^"\\]{1,128})"')


def tool_name_from_text(text: str) -> str:
    match = _NAME.search(text)
    return match.group(1) if match else UNKNOWN_TOOL
