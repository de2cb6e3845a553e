"""What happened in a turn, per model call and per tool call.

Time to first token is measured on a streamed response: from sending the
request to the first chunk. vLLM sends that chunk (the assistant role) when
the engine produced the first token, so it covers queueing and prefill,
which is what a pinned KV cache shortens. Without streaming (`stream=False`)
`ttft_s` is None and only `duration_s` is known.

`pin_resumed` is the client's inference, not the server's word: a model call
that follows a tool step "found its pin" when its cached prompt tokens
(`usage.prompt_tokens_details.cached_tokens`) cover the previous call's whole
prompt in full KV blocks. Prefix caching alone can do that too when nothing
evicted the blocks in between; the server's own count of pin hand-offs is in
the continuum metrics.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from vllm_continuum.agent.tools import ToolOutcome

__all__ = [
    "FinishReason",
    "ModelCallTrace",
    "ToolCallTrace",
    "TurnTrace",
    "full_block_tokens",
    "infer_pin_resumed",
]

FinishReason = Literal["answer", "step_limit", "model_error"]


class ModelCallTrace(BaseModel):
    step: int
    tool_choice: str  # "auto" / "required" / "none" / "function:<name>"
    last_turn_hint: bool  # carried `continuum_last_turn`
    ttft_s: float | None = None
    duration_s: float = 0.0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    tool_calls: list[str] = Field(default_factory=list)  # names the model called
    dropped_tool_calls: int = 0  # calls beyond the per-step limit, not executed
    after_tool_step: bool = False  # the previous step of this turn ran tools
    pin_resumed: bool | None = None  # inferred, see the module docstring; None: n/a
    error: str | None = None


class ToolCallTrace(BaseModel):
    step: int
    call_id: str
    name: str
    duration_s: float
    outcome: ToolOutcome
    error: str | None = None


class TurnTrace(BaseModel):
    session_id: str
    turn: int
    started_at: float  # wall clock, seconds since the epoch
    duration_s: float = 0.0
    finish_reason: FinishReason = "answer"
    model_calls: list[ModelCallTrace] = Field(default_factory=list)
    tool_calls: list[ToolCallTrace] = Field(default_factory=list)

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens or 0 for c in self.model_calls)

    @property
    def cached_tokens(self) -> int:
        return sum(c.cached_tokens or 0 for c in self.model_calls)


def full_block_tokens(prompt_tokens: int, block_size: int) -> int:
    return prompt_tokens // block_size * block_size


def infer_pin_resumed(
    previous_prompt_tokens: int | None, cached_tokens: int | None, block_size: int
) -> bool | None:
    """True if `cached_tokens` covers the previous prompt's full blocks; None if unknowable."""
    if previous_prompt_tokens is None or cached_tokens is None:
        return None
    full = full_block_tokens(previous_prompt_tokens, block_size)
    return cached_tokens >= full if full > 0 else None
