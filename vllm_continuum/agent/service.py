"""The agent as an HTTP service (FastAPI): sessions you create, talk to, read and delete.

    POST   /sessions                   {"system"?, "tools"?}            -> 201 session
    GET    /sessions/{id}              the session: history, turns, last traces
    GET    /sessions/{id}/messages     the history only
    POST   /sessions/{id}/messages     {"content", "tool_choice"?, "max_steps"?, "stream"?}
                                       -> 200 {answer, finish_reason, trace}
                                          or, with "stream": true, server-sent events:
                                          model_call, tool_result, step, ..., final
    DELETE /sessions/{id}              -> 204
    GET    /health

Errors are JSON `{"error": {"code", "message"}}`: 400 body not JSON, 404
unknown session, 409 a turn already running / history full, 413 message or
body too large, 422 a body that does not validate, 502 the model server
failed (the body still carries the turn's trace), 503 the store is full.

A turn runs as its own task: a client that disconnects mid-turn (or a
stream that is closed) does not cut the turn short, so the session is never
left half-updated; the session is saved after every step.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from vllm_continuum.agent.loop import AgentEvent, AgentLoop, HistoryFull, ToolChoice, TurnResult
from vllm_continuum.agent.store import InMemorySessionStore, Session, SessionStore, StoreFull

__all__ = ["AgentService", "ApiError", "ServiceLimits", "create_app"]

logger = logging.getLogger("vllm_continuum.agent")


@dataclass(frozen=True)
class ServiceLimits:
    max_message_chars: int = 16_000
    max_system_chars: int = 16_000
    max_body_bytes: int = 256 * 1024
    max_steps: int = 16  # a request may ask for fewer steps, never more


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction


ChoiceSpec = Literal["auto", "required", "none"] | NamedToolChoice


class CreateSessionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    system: str | None = Field(None, description="system prompt")
    tools: list[str] | None = Field(None, description="tool names (default: all)", max_length=64)


class MessageBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: str
    tool_choice: ChoiceSpec | list[ChoiceSpec] | None = Field(
        None, description="one choice for every step but the last (which answers), or one per step"
    )
    max_steps: int | None = Field(None, ge=1)
    stream: bool = False


class AgentService:
    """Sessions + loop, usable without HTTP (the app below is a thin layer)."""

    def __init__(
        self,
        loop: AgentLoop,
        store: SessionStore | None = None,
        limits: ServiceLimits | None = None,
    ) -> None:
        self.loop = loop
        self.store: SessionStore = store if store is not None else InMemorySessionStore()
        self.limits = limits or ServiceLimits()
        self._busy: set[str] = set()
        self._tasks: set[asyncio.Task[TurnResult]] = set()

    async def create_session(
        self, system: str | None = None, tools: list[str] | None = None
    ) -> Session:
        if system is not None and len(system) > self.limits.max_system_chars:
            raise ApiError(
                413, "system_too_large",
                f"system prompt is {len(system)} characters; the limit is "
                f"{self.limits.max_system_chars}",
            )
        if tools is not None:
            unknown = [t for t in tools if t not in self.loop.registry]
            if unknown:
                raise ApiError(
                    422, "unknown_tool",
                    f"unknown tools {unknown}; available: {self.loop.registry.names}",
                )
            tools = list(dict.fromkeys(tools))
        session = Session(tools=tools)
        if system:
            session.messages.append({"role": "system", "content": system})
        try:
            await self.store.create(session)
        except StoreFull as e:
            raise ApiError(503, "store_full", str(e)) from e
        return session

    async def get_session(self, session_id: str) -> Session:
        session = await self.store.get(session_id)
        if session is None:
            raise ApiError(
                404, "session_not_found",
                f"no session {session_id!r} (never created, deleted, or expired)",
            )
        return session

    async def delete_session(self, session_id: str) -> None:
        await self.get_session(session_id)
        if session_id in self._busy:
            raise ApiError(409, "turn_in_progress", f"session {session_id!r} is running a turn")
        await self.store.delete(session_id)

    async def start_turn(
        self,
        session_id: str,
        content: str,
        *,
        tool_choice: ToolChoice | list[ToolChoice] | None = None,
        max_steps: int | None = None,
        on_event: Callable[[AgentEvent], Awaitable[None] | None] | None = None,
    ) -> asyncio.Task[TurnResult]:
        """Validate, then run the turn as a task of its own (see the module docstring)."""
        limits = self.limits
        if not content.strip():
            raise ApiError(422, "empty_message", "content must not be empty")
        if len(content) > limits.max_message_chars:
            raise ApiError(
                413, "message_too_large",
                f"message is {len(content)} characters; the limit is {limits.max_message_chars}",
            )
        if isinstance(tool_choice, list) and not 1 <= len(tool_choice) <= limits.max_steps:
            raise ApiError(
                422, "invalid_tool_choice",
                f"a tool_choice list needs 1 to {limits.max_steps} items (one per step)",
            )
        if max_steps is not None and max_steps > limits.max_steps:
            raise ApiError(
                422, "too_many_steps", f"max_steps is {max_steps}; the limit is {limits.max_steps}"
            )
        session = await self.get_session(session_id)
        self._check_named_choices(session, tool_choice)
        if session_id in self._busy:
            raise ApiError(
                409, "turn_in_progress",
                f"session {session_id!r} is already running a turn; wait for its answer",
            )
        try:
            self.loop.check_room(session)
        except HistoryFull as e:
            raise ApiError(409, "history_full", str(e)) from e
        self._busy.add(session_id)
        steps = min(max_steps or self.loop.config.max_steps, limits.max_steps)

        async def save_on_step(event: AgentEvent) -> None:
            if event.type == "step":
                await self.store.save(session)
            if on_event is not None:
                outcome = on_event(event)
                if outcome is not None:
                    await outcome

        async def run() -> TurnResult:
            try:
                return await self.loop.run_turn(
                    session, content, tool_choice=tool_choice, max_steps=steps,
                    on_event=save_on_step,
                )
            finally:
                try:
                    await self.store.save(session)
                finally:
                    self._busy.discard(session_id)

        task = asyncio.create_task(run(), name=f"turn-{session_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def post_message(self, session_id: str, content: str, **kwargs: Any) -> TurnResult:
        """Run a turn to its end. The turn finishes even if this caller is cancelled."""
        task = await self.start_turn(session_id, content, **kwargs)
        return await asyncio.shield(task)

    def _check_named_choices(self, session: Session, choice: Any) -> None:
        choices = choice if isinstance(choice, list) else [choice]
        allowed = self.loop.registry.names if session.tools is None else session.tools
        for c in choices:
            if isinstance(c, dict) and c.get("type") == "function":
                name = c.get("function", {}).get("name")
                if name not in allowed:
                    raise ApiError(
                        422, "unknown_tool",
                        f"tool_choice names {name!r}, which is not a tool of this session "
                        f"({allowed})",
                    )

    async def aclose(self) -> None:
        """Cancel running turns (at shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse(status_code=status, content={**extra,
                                                      "error": {"code": code, "message": message}})


def _session_view(session: Session) -> dict[str, Any]:
    return {
        "id": session.id,
        "created_at": session.created_at,
        "updated_at": session.updated_at,
        "tools": session.tools,
        "turns": session.turns,
        "messages": session.messages,
        "traces": [t.model_dump() for t in session.traces],
    }


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class BodyLimit:
    """ASGI middleware: 413 for a body over `limit` bytes, declared or streamed."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_large = _error(
            413, "body_too_large", f"request body is over the limit of {self.limit} bytes"
        )
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await too_large(scope, receive, send)
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await too_large(scope, receive, send)
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def create_app(service: AgentService) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await service.aclose()

    app = FastAPI(title="vllm-continuum agent service", lifespan=lifespan)
    app.state.service = service
    app.add_middleware(BodyLimit, limit=service.limits.max_body_bytes)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        for err in errors:
            if err.get("type") == "json_invalid":
                ctx = err.get("ctx") or {}
                return _error(400, "invalid_json",
                              f"request body is not valid JSON: {ctx.get('error', err['msg'])}")
        parts = []
        for err in errors[:5]:
            loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
            parts.append(f"{loc}: {err.get('msg')}")
        return _error(422, "invalid_body", "invalid request body: " + "; ".join(parts))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "turns_running": len(service._busy)}

    @app.post("/sessions", status_code=201)
    async def create_session(body: CreateSessionBody | None = None) -> dict[str, Any]:
        body = body or CreateSessionBody()
        session = await service.create_session(system=body.system, tools=body.tools)
        return _session_view(session)

    @app.get("/sessions/{session_id}")
    async def read_session(session_id: str) -> dict[str, Any]:
        return _session_view(await service.get_session(session_id))

    @app.get("/sessions/{session_id}/messages")
    async def read_history(session_id: str) -> dict[str, Any]:
        session = await service.get_session(session_id)
        return {"session_id": session.id, "messages": session.messages}

    @app.delete("/sessions/{session_id}", status_code=204)
    async def delete_session(session_id: str) -> Response:
        await service.delete_session(session_id)
        return Response(status_code=204)

    @app.post("/sessions/{session_id}/messages", response_model=None)
    async def post_message(session_id: str, body: MessageBody) -> Any:
        choice = _plain_choice(body.tool_choice)
        if not body.stream:
            task = await service.start_turn(
                session_id, body.content, tool_choice=choice, max_steps=body.max_steps
            )
            try:
                result = await asyncio.shield(task)
            except Exception as e:  # noqa: BLE001 - a bug, not the model: say so
                logger.exception("turn of %s failed", session_id)
                return _error(500, "internal_error", f"the turn failed: {type(e).__name__}: {e}")
            if result.finish_reason == "model_error":
                return _error(502, "model_error", result.error or "model call failed",
                              **result.model_dump())
            return result.model_dump()

        queue: asyncio.Queue[AgentEvent | None] = asyncio.Queue()  # bounded by the turn's steps
        task = await service.start_turn(
            session_id, body.content, tool_choice=choice, max_steps=body.max_steps,
            on_event=queue.put_nowait,
        )
        task.add_done_callback(lambda _: queue.put_nowait(None))

        async def events() -> AsyncIterator[str]:
            while (event := await queue.get()) is not None:
                yield _sse(event.type, event.data)
            if not task.cancelled() and task.exception() is not None:
                e = task.exception()
                yield _sse("error", {"error": {"code": "internal_error",
                                               "message": f"{type(e).__name__}: {e}"}})

        return StreamingResponse(
            events(), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return app


def _plain_choice(choice: Any) -> ToolChoice | list[ToolChoice] | None:
    if isinstance(choice, list):
        return [_plain_choice(c) for c in choice]  # type: ignore[misc]
    if isinstance(choice, BaseModel):
        return choice.model_dump()
    return choice
