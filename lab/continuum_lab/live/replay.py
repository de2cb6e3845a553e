"""Replay a trace against an OpenAI-compatible server, as agents would send it.

Each program runs as its own task: it waits for its arrival time, then sends
its turns one after another to `/v1/completions` with token-id prompts that
grow exactly as an agent's history does (the previous prompt, the tokens the
server actually generated, then the turn's new tokens), and sleeps its tool
durations in between. Every request carries the program's `session_id` (body
field and `X-Session-ID` header, which routers hash). With `hints="all"` (the
default) it also carries the continuum hints (`continuum_tool` on a turn that
calls a tool, `continuum_last_turn` on the last; stock vLLM ignores them) and
its output length is fixed with `max_tokens` and `ignore_eos`; with
`hints="none"` it carries no hint, and a turn that calls a tool has the
engine write the call, which the server reads by itself (turn_body.py).

A one-shot request (chat traffic, trace_format.py) is sent at its arrival like a
program's only turn, but without a `session_id` or hints: to the server it
is any other user's request.

Recorded (results.py) per turn: send time, time to first token (streamed),
end time, prompt and cached tokens (`usage.prompt_tokens_details.cached_tokens`;
the server needs `--enable-prompt-tokens-details`), output tokens; per
program, its job completion time; one-shot requests apart.
"""

from __future__ import annotations

import asyncio
import random
import time

import httpx
from tqdm import tqdm

from vllm_continuum.core.hints import SESSION_HEADER
from continuum_lab.live.completion_stream import completion_events, token_ids
from continuum_lab.live.turn_body import (
    HINTS_ALL,
    HINTS_NONE,
    TOOL_CALL_TOKEN,
    ToolCallText,
    turn_body,
)
from continuum_lab.results import ProgramRecord, RunResult, TurnRecord
from continuum_lab.trace_format import Program, Trace

TOKEN_RANGE = (300, 2000)  # ordinary tokens of the project's tokenizers: no special ones


def new_tokens(program: Program, turn: int, n: int, seed: int) -> list[int]:
    """The turn's new tokens: random ids, distinct per (seed, program, turn)."""
    rng = random.Random(f"{seed}/{program.id}/{turn}")
    return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]


async def _served_model(client: httpx.AsyncClient) -> str:
    response = await client.get("/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def _send_turn(
    client: httpx.AsyncClient, body: dict, started: float
) -> tuple[float, float, list[int], dict]:
    """Stream one completion; return (ttft, end, generated ids, usage)."""
    sent = time.perf_counter()
    first = None
    ids: list[int] = []
    usage: dict = {}
    # The session also as the header routers hash (vLLM reads either).
    session = body.get("session_id")
    headers = {SESSION_HEADER: session} if session else None
    async for arrived, chunk in completion_events(client, body, headers):
        chunk_ids = token_ids(chunk)
        if chunk_ids and first is None:
            first = arrived
        ids.extend(chunk_ids)
        usage = chunk.get("usage") or usage
    end = time.perf_counter()
    return (first or end) - sent, end - started, ids, usage


async def _run_program(
    client: httpx.AsyncClient,
    model: str,
    program: Program,
    started: float,
    result: RunResult,
    bar: tqdm,
    *,
    time_scale: float,
    seed: int,
    session_prefix: str,
    hints: str,
    calls: dict[str, ToolCallText],
    call_token_id: int | None,
) -> None:
    arrival = program.arrival_s * time_scale
    await asyncio.sleep(max(0.0, started + arrival - time.perf_counter()))
    history: list[int] = []
    prev_prompt = 0
    session = f"{session_prefix}{program.id}"
    for k, turn in enumerate(program.turns):
        history += new_tokens(program, k, turn.new_tokens, seed)
        body = turn_body(
            model, history, turn, session=None if program.one_shot and not program.session else session,
            hints=hints,
            call=calls.get(turn.tool), call_token_id=call_token_id,
        )
        sent_s = time.perf_counter() - started
        ttft, end_s, ids, usage = await _send_turn(client, body, started)
        details = usage.get("prompt_tokens_details") or {}
        result.record(
            TurnRecord(
                program=program.id,
                turn=k,
                tool=turn.tool,
                sent_s=sent_s,
                ttft_s=ttft,
                latency_s=end_s - sent_s,
                prompt_tokens=int(usage.get("prompt_tokens", len(history))),
                cached_tokens=int(details.get("cached_tokens") or 0),
                output_tokens=int(usage.get("completion_tokens", len(ids))),
                prev_prompt_tokens=prev_prompt,
            ),
            program.one_shot,
        )
        bar.update()
        prev_prompt = len(history)
        history += ids
        if turn.tool:
            await asyncio.sleep(turn.tool_s * time_scale)
    if not program.one_shot:
        result.programs.append(ProgramRecord(program.id, arrival, end_s, len(program.turns)))


async def _token_ids(client: httpx.AsyncClient, model: str, text: str) -> tuple[int, ...]:
    response = await client.post("/tokenize", json={"model": model, "prompt": text,
                                                    "add_special_tokens": False})
    response.raise_for_status()
    return tuple(response.json()["tokens"])


async def tool_call_texts(
    client: httpx.AsyncClient, model: str, tools: set[str]
) -> tuple[dict[str, ToolCallText], int]:
    """Each tool's call text with the server tokenizer's ids for it, and the id of
    the tool-call token (asked before the replay starts, so outside its timing)."""
    call_ids = await _token_ids(client, model, TOOL_CALL_TOKEN)
    if len(call_ids) != 1:
        raise RuntimeError(
            f"the served model's tokenizer has no single {TOOL_CALL_TOKEN!r} token (it gives "
            f"{list(call_ids)}): --hints none needs a model whose tokenizer has it, as the "
            "benchmark and tiny models' do, since the server reads tool calls by that token"
        )
    calls = {}
    for tool in sorted(tools):
        head, tail = ToolCallText.texts(tool)
        calls[tool] = ToolCallText(tool, head, tail, await _token_ids(client, model, head),
                                   await _token_ids(client, model, tail))
    return calls, call_ids[0]


async def replay_async(
    base_url: str,
    trace: Trace,
    *,
    label: str = "run",
    time_scale: float = 1.0,
    seed: int = 0,
    timeout_s: float = 3600.0,
    session_prefix: str = "",
    progress: bool = True,
    hints: str = HINTS_ALL,
) -> RunResult:
    result = RunResult(label=label, started_at=time.time(), duration_s=0.0)
    limits = httpx.Limits(max_connections=len(trace) + 4, max_keepalive_connections=len(trace) + 4)
    async with httpx.AsyncClient(
        base_url=base_url.rstrip("/"), timeout=httpx.Timeout(timeout_s), limits=limits
    ) as client:
        model = await _served_model(client)
        calls, call_token_id = {}, None
        if hints == HINTS_NONE:
            tools = {t.tool for p in trace for t in p.turns if t.tool}
            calls, call_token_id = await tool_call_texts(client, model, tools)
        total_turns = sum(len(p.turns) for p in trace)
        with tqdm(total=total_turns, desc=f"replay {label}", unit="turn", disable=not progress) as bar:
            started = time.perf_counter()
            tasks = [
                asyncio.create_task(
                    _run_program(
                        client, model, p, started, result, bar,
                        time_scale=time_scale, seed=seed, session_prefix=session_prefix,
                        hints=hints, calls=calls, call_token_id=call_token_id,
                    )
                )
                for p in trace
            ]
            for task, program in zip(tasks, trace):
                try:
                    await task
                except Exception as exc:  # noqa: BLE001 - one failed program must not hide the others
                    result.errors.append(f"{program.id}: {type(exc).__name__}: {exc}")
            result.duration_s = time.perf_counter() - started
    result.meta.update({"base_url": base_url, "model": model, "time_scale": time_scale, "seed": seed,
                        "hints": hints})
    result.sort()
    return result


def replay(base_url: str, trace: Trace, **kwargs) -> RunResult:
    return asyncio.run(replay_async(base_url, trace, **kwargs))
