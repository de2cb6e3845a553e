"""Tool registry: typed Python functions in, OpenAI tool schemas and safe execution out.

A tool is an ordinary function (sync or async) whose annotated parameters
become a pydantic model; its JSON schema is what the model sees and what the
arguments are validated against, so the two can never drift apart. Execution
never raises: every failure (unknown tool, arguments that are not JSON or do
not validate, timeout, exception) comes back as a `ToolResult` whose content
is a clear error the model can read, so an agent's conversation goes on.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic_core import to_json

__all__ = ["Tool", "ToolCallRequest", "ToolOutcome", "ToolRegistry", "ToolResult"]

ToolOutcome = Literal["ok", "unknown_tool", "invalid_json", "invalid_arguments", "timeout", "error"]


@dataclass(frozen=True)
class ToolCallRequest:
    """One call as the model emitted it: arguments are the raw JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    name: str
    outcome: ToolOutcome
    content: str  # what goes into the `tool` message
    duration_s: float
    error: str | None = None  # short reason when outcome != "ok"

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def message(self) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": self.call_id, "content": self.content}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    fn: Callable[..., Any]
    args_model: type[BaseModel]
    timeout_s: float
    strict: bool = True

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def parameters_schema(self) -> dict[str, Any]:
        schema = _inline_refs(self.args_model.model_json_schema())
        schema = _drop_titles(schema)
        schema.setdefault("properties", {})
        schema["additionalProperties"] = False
        return schema

    def openai_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "strict": self.strict,
                "parameters": self.parameters_schema(),
            },
        }


@dataclass
class ToolRegistry:
    """Named tools, their schemas, and bounded, never-raising execution.

    `default_timeout_s` applies to tools registered without their own.
    Results longer than `max_result_chars` are cut (the history stays
    bounded). A sync tool runs in a worker thread; on timeout the agent
    moves on, but Python cannot kill the thread: it finishes in the
    background, so sync tools should have their own I/O timeouts too.
    """

    default_timeout_s: float = 10.0
    max_result_chars: int = 4000
    _tools: dict[str, Tool] = field(default_factory=dict)

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float | None = None,
        strict: bool = True,
    ) -> Any:
        """Decorator form of `register` (`@registry.tool` or `@registry.tool(timeout_s=2)`)."""

        def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
            self.register(f, name=name, description=description, timeout_s=timeout_s, strict=strict)
            return f

        return wrap(fn) if fn is not None else wrap

    def register(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float | None = None,
        strict: bool = True,
    ) -> Tool:
        name = name or fn.__name__
        if not name.replace("_", "").replace("-", "").isalnum() or len(name) > 64:
            raise ValueError(f"tool name {name!r}: use 1-64 letters, digits, '_' or '-'")
        if name in self._tools:
            raise ValueError(f"tool {name!r} is already registered")
        timeout = self.default_timeout_s if timeout_s is None else timeout_s
        if not timeout > 0:
            raise ValueError(f"tool {name!r}: timeout_s must be > 0")
        tool = Tool(
            name=name,
            description=description if description is not None else _first_paragraph(fn),
            fn=fn,
            args_model=_arguments_model(fn, name),
            timeout_s=float(timeout),
            strict=strict,
        )
        self._tools[name] = tool
        return tool

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def openai_tools(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The `tools` request field for the named tools (all if None)."""
        selected = self._tools if names is None else {n: self._tools[n] for n in names}
        return [t.openai_schema() for t in selected.values()]

    async def execute(
        self, call: ToolCallRequest, allowed: Iterable[str] | None = None
    ) -> ToolResult:
        """Run one call; every failure becomes an error result, never an exception.

        `allowed` restricts the callable tools (a session's subset): a call to
        a registered tool outside it is an unknown tool, as the model saw it.
        """
        started = time.perf_counter()

        def fail(outcome: ToolOutcome, reason: str) -> ToolResult:
            content = json.dumps({"error": outcome, "message": reason}, ensure_ascii=False)
            return ToolResult(
                call.id, call.name, outcome, content, time.perf_counter() - started, reason
            )

        names = list(self._tools) if allowed is None else [n for n in allowed if n in self._tools]
        tool = self._tools.get(call.name) if call.name in names else None
        if tool is None:
            available = ", ".join(names) or "none"
            return fail("unknown_tool", f"unknown tool {call.name!r}; available tools: {available}")
        try:
            raw = json.loads(call.arguments) if call.arguments.strip() else {}
        except ValueError as e:
            return fail("invalid_json", f"arguments of {call.name!r} are not valid JSON: {e}")
        if not isinstance(raw, dict):
            return fail("invalid_json", f"arguments of {call.name!r} must be a JSON object")
        try:
            args = tool.args_model.model_validate(raw)
        except ValidationError as e:
            return fail("invalid_arguments", f"invalid arguments for {call.name!r}: {_errors(e)}")
        kwargs = {k: getattr(args, k) for k in type(args).model_fields}
        try:
            if tool.is_async:
                value = await asyncio.wait_for(tool.fn(**kwargs), tool.timeout_s)
            else:
                value = await asyncio.wait_for(asyncio.to_thread(tool.fn, **kwargs), tool.timeout_s)
                if inspect.isawaitable(value):  # e.g. a partial of an async function
                    left = tool.timeout_s - (time.perf_counter() - started)
                    value = await asyncio.wait_for(value, max(left, 1e-3))
        except TimeoutError:
            return fail("timeout", f"tool {call.name!r} did not return within {tool.timeout_s:g} s")
        except Exception as e:  # noqa: BLE001 - a tool's failure is data for the model
            return fail("error", f"tool {call.name!r} failed: {type(e).__name__}: {e}")
        return ToolResult(
            call.id, call.name, "ok", self._render(value), time.perf_counter() - started
        )

    async def execute_all(
        self, calls: Sequence[ToolCallRequest], allowed: Iterable[str] | None = None
    ) -> list[ToolResult]:
        """Run parallel calls concurrently; results in the order of the calls."""
        allowed = None if allowed is None else list(allowed)
        return list(await asyncio.gather(*(self.execute(c, allowed) for c in calls)))

    def _render(self, value: Any) -> str:
        if isinstance(value, str):
            text = value
        else:
            try:
                text = to_json(value, inf_nan_mode="null", fallback=str).decode()
            except Exception:  # noqa: BLE001 - unserializable: fall back to its repr
                text = repr(value)
        if len(text) > self.max_result_chars:
            cut = len(text) - self.max_result_chars
            text = text[: self.max_result_chars] + f"...[truncated {cut} chars]"
        return text


def _arguments_model(fn: Callable[..., Any], name: str) -> type[BaseModel]:
    """A pydantic model of `fn`'s parameters (all annotated, keyword-passable)."""
    fields: dict[str, Any] = {}
    hints = _type_hints(fn)
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"tool {name!r}: parameter {p.name!r} must be passable by keyword")
        if p.name not in hints:
            raise TypeError(f"tool {name!r}: parameter {p.name!r} needs a type annotation")
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (hints[p.name], default)
    model_name = "".join(part.capitalize() for part in name.replace("-", "_").split("_")) + "Args"
    return create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    import functools
    import typing

    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        target = getattr(target, "__call__", target)  # a callable object
    return typing.get_type_hints(target, include_extras=True)


def _first_paragraph(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def _errors(e: ValidationError) -> str:
    parts = []
    for err in e.errors(include_url=False)[:5]:
        where = ".".join(str(x) for x in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Replace `$ref`s to `$defs` by their definitions (enums, nested models):
    simpler for guided-decoding backends and for small models to read."""
    defs = schema.get("$defs", {})

    def walk(node: Any, depth: int = 0) -> Any:
        if depth > 32:
            raise ValueError("tool schema nests too deeply (recursive types are not supported)")
        if isinstance(node, dict):
            if "$ref" in node and node["$ref"].startswith("#/$defs/"):
                target = defs[node["$ref"].split("/")[-1]]
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return walk({**target, **rest}, depth + 1)
            return {k: walk(v, depth + 1) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v, depth + 1) for v in node]
        return node

    return walk(schema)


def _drop_titles(node: Any, in_properties: bool = False) -> Any:
    """pydantic's auto-generated `title`s cost prompt tokens and say nothing."""
    if isinstance(node, dict):
        return {
            k: _drop_titles(v, in_properties=(k == "properties" and not in_properties))
            for k, v in node.items()
            if in_properties or k != "title"
        }
    if isinstance(node, list):
        return [_drop_titles(v) for v in node]
    return node
