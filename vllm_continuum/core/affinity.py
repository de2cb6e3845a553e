"""Broken session affinity, as one engine can see it.

A pin lives in one engine. When a router sends a session's next turn to
another engine, the pin is wasted (held until its TTL, never hit) and the
turn prefills its whole history. No single engine sees the routing, but each
can notice a turn that continues a conversation it did not serve:

    a request of a session whose prompt holds more tool results than this
    engine has seen the session produce.

A tool result in the prompt (Hermes-style templates wrap each in a
`<tool_response>` special token; configurable) means an earlier turn of the
session ended in a tool call. If this engine has never seen the session, that
earlier turn ran elsewhere. If it has, it knows the length of the last prompt
it saw and how many tool calls that turn produced (`<tool_call>` tokens in
its output); the next prompt extends that one, and more tool results in the
appended part than calls made means turns ran elsewhere in between. Cost:
one scan of the appended tokens per new request (of a new session: up to
its first tool result). Each such request counts once as an affinity miss
(`continuum_affinity_misses_total`). The adapter feeds it from the
scheduler's `add_request` and the finish of a request.

Why this signal: it needs nothing from the router or the client (no header,
no shared state), costs one scan of the prompt's token ids per new request,
and does not fire on the first turn of a session or on turns that continue
here. The `<tool_call>` token itself is not usable on the prompt side: tool
preambles of chat templates mention it (`... within <tool_call></tool_call>
XML tags`), so it is in every prompt that offers tools. Limits: a model whose
template has no tool-result token gives no signal (set `tool_result_token`
to its token); a client that trims the history
(so the prompt no longer extends the previous one) is not judged; sessions
forgotten by the bounded table look new (a miss may then be counted for a
session idle that long).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

def count_token(token_ids: Sequence[int], token_id: int | None) -> int:
    """Occurrences of `token_id`, at C speed (~0.1 ms per 100k tokens): a
    sequence that is not a list (vLLM's read-only `ConstantList`, whose
    inherited `count` loops in Python) is copied to one first."""
    if token_id is None:
        return 0
    return (token_ids if isinstance(token_ids, list) else list(token_ids)).count(token_id)


def is_affinity_miss(new_results: int, seen: SeenTurn | None) -> bool:
    """The rule above, on counts. `seen`: what this engine saw of the session;
    `new_results`: tool results in the prompt past the last prompt it saw
    (the whole prompt if it never saw the session)."""
    if seen is None:
        return new_results > 0
    return new_results > max(seen.calls_in_output, 0)


@dataclass
class SeenTurn:
    prompt_len: int  # tokens of the last prompt this engine saw (the next one extends it)
    calls_in_output: int = 0  # tool calls in that turn's output (0 until it finishes)
    request_id: str | None = None


class AffinityMonitor:
    """Per-engine memory of sessions (bounded, least recently seen dropped)."""

    def __init__(
        self,
        result_token_id: int | None,
        call_token_id: int | None,
        on_miss: Callable[[], None] = lambda: None,
        max_sessions: int = 100_000,
    ) -> None:
        self.result_token_id = result_token_id
        self.call_token_id = call_token_id
        self.on_miss = on_miss
        self.max_sessions = max_sessions
        self.misses = 0
        self._seen: OrderedDict[str, SeenTurn] = OrderedDict()

    @property
    def active(self) -> bool:
        return self.result_token_id is not None

    def on_arrival(self, session: str | None, request_id: str, prompt_token_ids: Sequence[int]) -> bool:
        """Record a new request; True if it is an affinity miss."""
        if not session or not self.active:
            return False
        seen = self._seen.get(session)
        if seen is None:  # any tool result at all (stops at the first)
            new_results = int(self.result_token_id in prompt_token_ids)
        else:  # only what was appended since (O(new tokens), not O(context))
            new_results = count_token(prompt_token_ids[seen.prompt_len:], self.result_token_id)
        miss = is_affinity_miss(new_results, seen)
        self._seen[session] = SeenTurn(len(prompt_token_ids), 0, request_id)
        self._seen.move_to_end(session)
        while len(self._seen) > self.max_sessions:
            self._seen.popitem(last=False)
        if miss:
            self.misses += 1
            self.on_miss()
        return miss

    def on_finish(self, session: str | None, request_id: str, output_token_ids: Sequence[int]) -> None:
        """Record how many tool calls a finished turn made (its next prompt holds their results)."""
        seen = self._seen.get(session) if session else None
        if seen is not None and seen.request_id == request_id:
            seen.calls_in_output = count_token(output_token_ids, self.call_token_id)
