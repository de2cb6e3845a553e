"""A replayed turn's request body, with the continuum hints or without any.

`--hints all` (the default) is how the replay has always run: every agent
turn carries its session and the continuum hints in `vllm_xargs` (the tool
it calls, or that it ends the program), and its output length is forced
with `max_tokens`, `min_tokens` and `ignore_eos`.

`--hints none` is how users will run the server: the request carries only
vLLM's own `session_id` (and the `X-Session-ID` header, replay.py), and the
server must see by itself that a turn ended in a tool call. It reads that
from the finished output, as it would from a trained Hermes/Qwen model's
(core/tool_calls/): the single `<tool_call>` token, then
`{"name": "...`. The benchmark model has random weights, so the replay has
the engine itself write the call, with vLLM's structured outputs: the turn
is constrained to the regex of

    <tool_call>{"name": "TOOL", "arguments": {"n": "DDDD..."}}</tool_call>

(the trace's tool name, digits padding it to about the trace's output
length; the tokenizer splits digits one per token). Under a grammar a random
model spells the fixed text with arbitrary small tokens, `<tool_call>`
byte by byte as often as not, which the server rightly does not read as a
call; a `logit_bias` on the fixed text's own tokens (the server's
`/tokenize` of it, ToolCallText) makes the engine write it as a trained
model would: `<tool_call>` as one token, the rest in about as many tokens as
the tokenizer gives it. So a tool turn's output is at least the call itself
(about 20 tokens for this tokenizer) and ends where the grammar does (no
`ignore_eos`). A turn that calls no tool is ordinary text of the trace's
length, with `<tool_call>` biased away so that a random model's chance
emission of it (about one in the vocabulary size per token) does not make
the server pin a finished program.

Nothing here is a continuum hint: stock vLLM gets the same bodies.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from vllm_continuum.core.tool_calls.families import FAMILY
from continuum_lab.trace_format import Turn, continuum_hints

HINTS_ALL = "all"
HINTS_NONE = "none"
HINT_MODES = (HINTS_ALL, HINTS_NONE)
# The token the server reads the tiny model's (Hermes) tool call by.
TOOL_CALL_TOKEN = FAMILY["hermes"].starts[0]
_CALL_END = "</tool_call>"
_FORCE = 100.0  # logit_bias's bound in vLLM: a token the grammar allows is then taken


@dataclass(frozen=True)
class ToolCallText:
    """One tool's call as the engine is made to write it: the fixed text before
    the padding digits and after them, and the server tokenizer's ids for each."""

    tool: str
    head: str
    tail: str
    head_ids: tuple[int, ...]
    tail_ids: tuple[int, ...]

    @staticmethod
    def texts(tool: str) -> tuple[str, str]:
        """(head, tail) for `tool`: the text to tokenize on the server."""
        name = json.dumps(tool)  # a JSON string, quotes included
        return f'{TOOL_CALL_TOKEN}{{"name": {name}, "arguments": {{"n": "', f'"}}}}{_CALL_END}'

    @property
    def fixed_tokens(self) -> int:
        """Tokens of the call without its digits, and the end-of-sequence token."""
        return len(self.head_ids) + len(self.tail_ids) + 1

    def regex(self, digits: int) -> str:
        pad = f"[0-9]{{{digits}}}" if digits else ""
        return _literal(self.head) + pad + _literal(self.tail)


def _literal(text: str) -> str:
    """`text` as a regex matching it alone. Only the metacharacters are escaped
    (re.escape also escapes spaces, which not every grammar engine reads)."""
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", text)


def turn_body(
    model: str,
    prompt: list[int],
    turn: Turn,
    *,
    session: str | None,
    hints: str = HINTS_ALL,
    call: ToolCallText | None = None,
    call_token_id: int | None = None,
) -> dict:
    """The `/v1/completions` body of one replayed turn (streamed, greedy, with
    the generated token ids). `session` None: a one-shot request, sent the
    same way under either mode. With `hints` none, a tool turn needs its
    `call` and a turn without a tool the `call_token_id` (ToolCallText's
    first head id) to bias away."""
    if hints not in HINT_MODES:
        raise ValueError(f"hints must be one of {HINT_MODES}, not {hints!r}")
    body = {
        "model": model,
        "prompt": prompt,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    fixed_length = {"max_tokens": turn.output_tokens, "min_tokens": turn.output_tokens,
                    "ignore_eos": True}
    if session is None:
        return body | fixed_length
    body["session_id"] = session
    if hints == HINTS_ALL:
        return body | fixed_length | {"vllm_xargs": continuum_hints(turn)}
    if turn.tool is None:
        if call_token_id is None:
            raise ValueError("a turn without a tool needs call_token_id under hints none")
        return body | fixed_length | {"logit_bias": {str(call_token_id): -_FORCE}}
    if call is None or call.tool != turn.tool:
        raise ValueError(f"a {turn.tool!r} turn needs that tool's ToolCallText under hints none")
    digits = max(0, turn.output_tokens - call.fixed_tokens)
    return body | {
        # Room for the call even if the engine spells some of its text in more
        # tokens than the tokenizer does; the grammar ends it before that.
        "max_tokens": digits + 2 * call.fixed_tokens + 8,
        "structured_outputs": {"regex": call.regex(digits)},
        "logit_bias": {str(i): _FORCE for i in {*call.head_ids, *call.tail_ids}},
    }
