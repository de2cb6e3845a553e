"""A stateful tool-calling agent over any OpenAI-compatible server.

The pieces, by role: `tools` (typed Python functions -> schemas, validated
and bounded execution), `store` (sessions; bounded, expiring, replaceable),
`loop` (one user turn: model, tools, model, ... answer), `trace` (what each
model and tool call cost), `service` (the same over HTTP, FastAPI),
`demo_tools` (tools with realistic latency and failures).
"""

from vllm_continuum.agent.loop import (
    AgentEvent,
    AgentLoop,
    HistoryFull,
    LoopConfig,
    TurnResult,
    tool_choice_schedule,
)
from vllm_continuum.agent.store import InMemorySessionStore, Session, SessionStore, StoreFull
from vllm_continuum.agent.tools import Tool, ToolCallRequest, ToolRegistry, ToolResult
from vllm_continuum.agent.trace import ModelCallTrace, ToolCallTrace, TurnTrace

__all__ = [
    "AgentEvent",
    "AgentLoop",
    "HistoryFull",
    "InMemorySessionStore",
    "LoopConfig",
    "ModelCallTrace",
    "Session",
    "SessionStore",
    "StoreFull",
    "Tool",
    "ToolCallRequest",
    "ToolCallTrace",
    "ToolRegistry",
    "ToolResult",
    "TurnResult",
    "TurnTrace",
    "tool_choice_schedule",
]
