"""The agent loop: one user turn = model call, tools, model call, ... answer.

Every request of a session carries its id (vLLM's `session_id` body field,
and the `X-Session-ID` header, which vLLM also reads and which routers such
as vllm-router's `consistent_hash` policy hash to keep a session on one
engine), so the continuum scheduler can keep the session's KV blocks pinned
while the tools run, and the step the loop knows is the last carries
`vllm_xargs.continuum_last_turn` so the server does not pin it. Both are
plain request fields: stock vLLM serves them as usual, and for a server that
rejects unknown fields the loop drops them once and goes on without.

History integrity: the user's message is appended first; each step's
assistant message and all its tool results are appended together, after
every tool returned. A failing tool is a `tool` message, a failing model call
ends the turn with `finish_reason="model_error"`; either way nothing already
in the session is lost and the history stays valid for the next request.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import openai
from openai import AsyncOpenAI
from pydantic import BaseModel

from vllm_continuum.agent.store import Session
from vllm_continuum.agent.tools import ToolCallRequest, ToolRegistry
from vllm_continuum.agent.trace import (
    FinishReason,
    ModelCallTrace,
    ToolCallTrace,
    TurnTrace,
    infer_pin_resumed,
)
from vllm_continuum.core.hints import LAST_TURN_KEY, SESSION_HEADER

__all__ = [
    "AgentEvent",
    "AgentLoop",
    "HistoryFull",
    "LoopConfig",
    "ToolChoice",
    "ToolChoicePolicy",
    "TurnResult",
    "tool_choice_schedule",
]

logger = logging.getLogger("vllm_continuum.agent")

ToolChoice = str | dict[str, Any]  # "auto" | "required" | "none" | {"type": "function", ...}
ToolChoicePolicy = Callable[[int, int], ToolChoice]  # (step, max_steps) -> choice


def tool_choice_schedule(
    choice: ToolChoice | Sequence[ToolChoice] | ToolChoicePolicy | None,
) -> ToolChoicePolicy:
    """Turn a caller's `tool_choice` into a per-step policy.

    - None: "auto" on every step but the last, which gets "none", so a turn
      ends with an answer rather than at the step limit.
    - one choice: the same, with that choice instead of "auto".
    - a list: step i uses item i; steps past the list use its last item
      (e.g. ["required", "required", "none"]: two tool steps, then answer).
    - a callable (step, max_steps) -> choice: anything else.
    """
    if callable(choice):
        return choice
    if choice is None or isinstance(choice, str | dict):
        every = choice if choice is not None else "auto"
        return lambda step, max_steps: "none" if step >= max_steps - 1 else every
    items = list(choice)
    if not items:
        raise ValueError("an empty tool_choice list")
    return lambda step, max_steps: items[min(step, len(items) - 1)]


def _choice_label(choice: ToolChoice) -> str:
    if isinstance(choice, dict):
        return "function:" + str(choice.get("function", {}).get("name", "?"))
    return choice


@dataclass
class LoopConfig:
    model: str
    max_steps: int = 8
    max_tokens: int = 256
    temperature: float | None = None
    seed: int | None = None
    parallel_tool_calls: bool | None = None  # None: the server's default
    max_tool_calls_per_step: int = 8  # calls beyond this are dropped, not executed
    max_history_messages: int = 512  # a session's history never grows past this
    max_traces: int = 8  # turn traces kept in a session
    stream: bool = True  # needed for time to first token
    session_hints: bool = True  # send `session_id` (and the last-turn hint)
    last_turn_hint: bool = True  # mark the last known step `continuum_last_turn`
    block_size: int = 32  # the server's KV block size, for the pin inference
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.max_tool_calls_per_step < 1:
            raise ValueError("max_steps and max_tool_calls_per_step must be >= 1")
        if self.max_history_messages < 3 + self.max_tool_calls_per_step:
            raise ValueError("max_history_messages leaves no room for one tool step")


class HistoryFull(Exception):
    """The session's history cannot take another turn."""


class AgentEvent(BaseModel):
    """One thing that happened during a turn, in order (the service streams these)."""

    type: Literal["model_call", "tool_result", "step", "final"]
    data: dict[str, Any]


class TurnResult(BaseModel):
    session_id: str
    answer: str | None  # None unless finish_reason == "answer"
    finish_reason: FinishReason
    error: str | None = None
    trace: TurnTrace


EventHandler = Callable[[AgentEvent], Awaitable[None] | None]


@dataclass
class _Reply:
    content: str | None
    tool_calls: list[ToolCallRequest]
    finish_reason: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    ttft_s: float | None
    duration_s: float


class AgentLoop:
    """Runs turns of sessions against any OpenAI-compatible chat endpoint."""

    def __init__(self, client: AsyncOpenAI, registry: ToolRegistry, config: LoopConfig) -> None:
        self.client = client
        self.registry = registry
        self.config = config
        self._send_hints = config.session_hints

    def check_room(self, session: Session) -> None:
        """HistoryFull unless a user message and an answer still fit."""
        limit = self.config.max_history_messages
        if len(session.messages) + 2 > limit:
            raise HistoryFull(
                f"session {session.id!r} holds {len(session.messages)} messages; the limit is "
                f"{limit}: start a new session"
            )

    async def run_turn(
        self,
        session: Session,
        user_message: str,
        *,
        tool_choice: ToolChoice | Sequence[ToolChoice] | ToolChoicePolicy | None = None,
        max_steps: int | None = None,
        on_event: EventHandler | None = None,
    ) -> TurnResult:
        """One user turn; mutates `session` in place and returns the answer and trace.

        Raises only HistoryFull (before anything is changed) and cancellation.
        Run one turn per session at a time (the service enforces it): two
        interleaved turns would interleave their messages.
        """
        cfg = self.config
        steps = cfg.max_steps if max_steps is None else max_steps
        if steps < 1:
            raise ValueError("max_steps must be >= 1")
        policy = tool_choice_schedule(tool_choice)
        self.check_room(session)
        allowed = self.registry.names if session.tools is None else list(session.tools)
        tools = self.registry.openai_tools([n for n in allowed if n in self.registry])

        started = time.perf_counter()
        trace = TurnTrace(session_id=session.id, turn=session.turns, started_at=time.time())
        session.messages.append({"role": "user", "content": user_message})
        answer: str | None = None
        error: str | None = None
        finish: FinishReason = "step_limit"
        previous_prompt: int | None = None  # prompt of the call before a tool step

        for step in range(steps):
            choice: ToolChoice = policy(step, steps) if tools else "none"
            room = cfg.max_history_messages - len(session.messages)
            if room < 2 + cfg.max_tool_calls_per_step:  # a tool step, then an answer
                choice = "none"
            last = step == steps - 1 or choice == "none"
            call = ModelCallTrace(
                step=step,
                tool_choice=_choice_label(choice),
                last_turn_hint=last and cfg.last_turn_hint and self._send_hints,
                after_tool_step=previous_prompt is not None,
            )
            try:
                reply = await self._call_model(session, tools, choice, last)
            except (openai.APIError, httpx.HTTPError, ValueError) as e:
                call.error = _describe(e)
                trace.model_calls.append(call)
                await _emit(on_event, "model_call", {"trace": call.model_dump()})
                finish, error = "model_error", call.error
                break
            call.last_turn_hint = last and cfg.last_turn_hint and self._send_hints
            calls = reply.tool_calls[: cfg.max_tool_calls_per_step]
            call.ttft_s, call.duration_s = reply.ttft_s, reply.duration_s
            call.prompt_tokens, call.cached_tokens = reply.prompt_tokens, reply.cached_tokens
            call.completion_tokens = reply.completion_tokens
            call.finish_reason = reply.finish_reason
            call.tool_calls = [c.name for c in calls]
            call.dropped_tool_calls = len(reply.tool_calls) - len(calls)
            if previous_prompt is not None:
                call.pin_resumed = infer_pin_resumed(
                    previous_prompt, reply.cached_tokens, cfg.block_size
                )
            trace.model_calls.append(call)
            await _emit(
                on_event,
                "model_call",
                {
                    "trace": call.model_dump(),
                    "content": reply.content,
                    "tool_calls": [_call_dict(c) for c in calls],
                },
            )
            if not calls:
                session.messages.append({"role": "assistant", "content": reply.content or ""})
                answer, finish = reply.content or "", "answer"
                break

            results = await self.registry.execute_all(calls, allowed)
            step_messages: list[dict[str, Any]] = [
                {
                    "role": "assistant",
                    "content": reply.content or None,
                    "tool_calls": [_call_dict(c) for c in calls],
                }
            ]
            for result in results:
                tool_trace = ToolCallTrace(
                    step=step,
                    call_id=result.call_id,
                    name=result.name,
                    duration_s=result.duration_s,
                    outcome=result.outcome,
                    error=result.error,
                )
                trace.tool_calls.append(tool_trace)
                step_messages.append(result.message())
                await _emit(
                    on_event,
                    "tool_result",
                    {"trace": tool_trace.model_dump(), "content": result.content},
                )
            session.messages.extend(step_messages)  # the step lands whole, or not at all
            previous_prompt = reply.prompt_tokens
            await _emit(on_event, "step", {"step": step, "messages": len(session.messages)})

        trace.finish_reason = finish
        trace.duration_s = time.perf_counter() - started
        session.turns += 1
        session.traces = [*session.traces, trace][-cfg.max_traces :]
        result = TurnResult(
            session_id=session.id, answer=answer, finish_reason=finish, error=error, trace=trace
        )
        await _emit(on_event, "final", result.model_dump())
        return result

    async def _call_model(
        self, session: Session, tools: list[dict[str, Any]], choice: ToolChoice, last: bool
    ) -> _Reply:
        cfg = self.config
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "messages": session.messages,
            "max_tokens": cfg.max_tokens,
        }
        if tools:
            # Tools go out even with "none": they are part of the rendered
            # prompt, and an unchanged prefix is what the KV cache reuses.
            kwargs["tools"] = tools
            kwargs["tool_choice"] = choice
            if cfg.parallel_tool_calls is not None:
                kwargs["parallel_tool_calls"] = cfg.parallel_tool_calls
        if cfg.temperature is not None:
            kwargs["temperature"] = cfg.temperature
        if cfg.seed is not None:
            kwargs["seed"] = cfg.seed
        if cfg.session_hints:
            kwargs["extra_headers"] = {SESSION_HEADER: session_header_value(session.id)}
        if not self._send_hints:
            return await self._request(kwargs, dict(cfg.extra_body))
        extra = dict(cfg.extra_body)
        extra["session_id"] = session.id
        if last and cfg.last_turn_hint:
            extra["vllm_xargs"] = {**extra.get("vllm_xargs", {}), LAST_TURN_KEY: 1}
        try:
            return await self._request(kwargs, extra)
        except openai.BadRequestError as e:
            text = str(e).lower()
            if not any(k in text for k in ("session_id", "vllm_xargs", "extra", "unrecognized")):
                raise
            logger.warning(
                "the server rejected the session fields (%s); continuing without them", e
            )
            self._send_hints = False
            return await self._request(kwargs, dict(cfg.extra_body))

    async def _request(self, kwargs: dict[str, Any], extra: dict[str, Any]) -> _Reply:
        started = time.perf_counter()
        if not self.config.stream:
            response = await self.client.chat.completions.create(**kwargs, extra_body=extra or None)
            message = response.choices[0].message
            calls = [
                ToolCallRequest(
                    id=tc.id or f"call_{i}", name=tc.function.name, arguments=tc.function.arguments
                )
                for i, tc in enumerate(message.tool_calls or [])
                if getattr(tc, "function", None) is not None
            ]
            prompt, cached, completion = _usage(response.usage)
            return _Reply(
                message.content, calls, response.choices[0].finish_reason, prompt, cached,
                completion, None, time.perf_counter() - started,
            )

        stream = await self.client.chat.completions.create(
            **kwargs,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra or None,
        )
        ttft: float | None = None
        content: list[str] = []
        parts: dict[int, dict[str, Any]] = {}
        finish_reason: str | None = None
        usage = None
        async with stream:  # closes the connection on errors and cancellation
            async for chunk in stream:
                if ttft is None:
                    ttft = time.perf_counter() - started
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    if choice.finish_reason:
                        finish_reason = choice.finish_reason
                    delta = choice.delta
                    if delta is None:
                        continue
                    if delta.content:
                        content.append(delta.content)
                    for tc in delta.tool_calls or []:
                        part = parts.setdefault(
                            tc.index, {"id": None, "name": "", "arguments": ""}
                        )
                        if tc.id:
                            part["id"] = tc.id
                        if tc.function is not None:
                            part["name"] += tc.function.name or ""
                            part["arguments"] += tc.function.arguments or ""
        calls = [
            ToolCallRequest(id=p["id"] or f"call_{i}", name=p["name"], arguments=p["arguments"])
            for i, p in sorted(parts.items())
        ]
        prompt, cached, completion = _usage(usage)
        return _Reply(
            "".join(content) if content else None, calls, finish_reason, prompt, cached,
            completion, ttft, time.perf_counter() - started,
        )


_MAX_HEADER_ID = 256


def session_header_value(session_id: str) -> str:
    """The session id as an HTTP header value: as is if it is short printable
    ASCII, else a stable digest (the body field still carries the real id,
    and vLLM prefers the body; a router only needs a stable key)."""
    if len(session_id) <= _MAX_HEADER_ID and session_id.isascii() and session_id.isprintable():
        return session_id
    return "sha256:" + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


def _usage(usage: Any) -> tuple[int | None, int | None, int | None]:
    if usage is None:
        return None, None, None
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    return usage.prompt_tokens, cached, usage.completion_tokens


def _call_dict(call: ToolCallRequest) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _describe(e: Exception) -> str:
    status = getattr(e, "status_code", None)
    prefix = f"model server answered {status}" if status else "model call failed"
    return f"{prefix}: {type(e).__name__}: {e}"[:1000]


async def _emit(handler: EventHandler | None, kind: str, data: dict[str, Any]) -> None:
    if handler is None:
        return
    try:
        outcome = handler(AgentEvent(type=kind, data=data))  # type: ignore[arg-type]
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:  # noqa: BLE001 - an observer's failure must not break the turn
        logger.exception("agent event handler failed on %s", kind)
