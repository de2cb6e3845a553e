"""Agent sessions through a router in front of several continuum instances.

Each session is an agent program: a turn ends in a parsed tool call, the
tool "runs" (a pause), and the next turn sends the history plus the tool's
result, through the router, with the session id as the `X-Session-ID`
header (what vllm-router's `consistent_hash` hashes) and the `session_id`
body field (what the continuum scheduler keys pins by). Meanwhile other
users' traffic goes straight to every instance and cycles its KV pool, so a
turn finds its previous prompt cached only if a pin held it there.

Every instance names itself in the `X-Continuum-Instance` response header
(`vllm_continuum.cluster.instance_header`), so each turn records who served it.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from openai import OpenAI

from vllm_continuum.cluster.instance_header import HEADER as INSTANCE_HEADER
from vllm_continuum.core.hints import LAST_TURN_KEY, SESSION_HEADER
from vllm_continuum.demos.pause_scenario import WEATHER_TOOL, cached_tokens, filler_text


@dataclass(frozen=True)
class Turn:
    session: str
    turn: int
    instance: str
    prompt_tokens: int
    cached_tokens: int
    attempts: int
    prev_instance: str | None = None
    prev_prompt_tokens: int | None = None

    def prev_full_block_tokens(self, block_size: int) -> int:
        return (self.prev_prompt_tokens or 0) // block_size * block_size

    def reused_all(self, block_size: int) -> bool:
        """Found every full block of the previous turn's prompt cached."""
        return self.cached_tokens >= self.prev_full_block_tokens(block_size)

    @property
    def moved(self) -> bool:
        return self.prev_instance is not None and self.instance != self.prev_instance


@dataclass
class ScenarioResult:
    turns: list[Turn]
    churn_requests: int
    elapsed_s: float
    block_size: int

    @property
    def resumed(self) -> list[Turn]:
        return [t for t in self.turns if t.turn > 0]

    @property
    def retries(self) -> int:
        return sum(t.attempts - 1 for t in self.turns)

    def summary(self) -> dict:
        resumed = self.resumed
        prev_full = sum(t.prev_full_block_tokens(self.block_size) for t in resumed)
        cached = sum(min(t.cached_tokens, t.prev_full_block_tokens(self.block_size))
                     for t in resumed)
        return {
            "resumed_turns": len(resumed),
            "same_instance": sum(not t.moved for t in resumed),
            "reused_all_full_blocks": sum(t.reused_all(self.block_size) for t in resumed),
            "prev_prompt_full_block_tokens": prev_full,
            "of_which_cached": cached,
            "prompt_tokens": sum(t.prompt_tokens for t in resumed),
            "cached_tokens": sum(t.cached_tokens for t in resumed),
            "churn_requests": self.churn_requests,
            "retries": self.retries,
            "elapsed_s": round(self.elapsed_s, 1),
        }


def _churn(urls: list[str], stop: threading.Event, counter: list[int], *, tokens: int,
           vocab: int, seed: int, model: str) -> None:
    """Other users: distinct random-token prompts, round the instances, until stopped."""
    rng = random.Random(seed)
    with httpx.Client(timeout=120) as http:
        i = 0
        while not stop.is_set():
            prompt = [rng.randrange(300, vocab - 300) for _ in range(tokens)]
            url = urls[i % len(urls)]
            i += 1
            try:
                http.post(f"{url}/v1/completions",
                          json={"model": model, "prompt": prompt, "max_tokens": 1})
                counter[0] += 1
            except httpx.HTTPError:
                time.sleep(0.2)


def _ask(client: OpenAI, messages: list[dict], session: str, *, last: bool, seed: int,
         model: str, tries: int = 8):
    """One model call through the router; a tool turn retries until a call parses."""
    extra: dict = {"session_id": session}
    if last:
        extra["vllm_xargs"] = {LAST_TURN_KEY: 1}
    failed = None
    for attempt in range(1, tries + 1):
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            tools=[WEATHER_TOOL],
            tool_choice="none" if last else "required",
            parallel_tool_calls=False,
            max_tokens=8 if last else 64,
            temperature=0.7,
            seed=seed + attempt,
            extra_body=extra,
            extra_headers={SESSION_HEADER: session},
        )
        response = raw.parse()
        if last or response.choices[0].message.tool_calls:
            return response, raw.headers.get(INSTANCE_HEADER, "?"), attempt
        failed = (response.choices[0].finish_reason, response.choices[0].message.content)
    raise RuntimeError(f"{session}: no parsed tool call after {tries} tries; last: {failed!r}")


def _session(client: OpenAI, session: str, *, turns: int, words: int, pause_s: tuple[float, float],
             seed: int, model: str) -> list[Turn]:
    rng = random.Random(seed)
    messages: list[dict] = [
        {"role": "system", "content": "You are a travel agent. Use tools to check the weather."},
        {"role": "user", "content": f"Trip notes {session}: " + filler_text(rng, words)
         + "\nCheck the weather for each city in turn."},
    ]
    out: list[Turn] = []
    prev: Turn | None = None
    for turn in range(turns):
        last = turn == turns - 1
        response, instance, attempts = _ask(client, messages, session, last=last,
                                            seed=seed * 100 + turn * 10, model=model)
        record = Turn(session, turn, instance, response.usage.prompt_tokens,
                      cached_tokens(response.usage), attempts,
                      prev.instance if prev else None, prev.prompt_tokens if prev else None)
        out.append(record)
        prev = record
        if last:
            break
        call = response.choices[0].message.tool_calls[0]
        time.sleep(rng.uniform(*pause_s))  # the tool runs; other traffic goes on
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call.id, "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }]},
            {"role": "tool", "tool_call_id": call.id,
             "content": f'{{"sky": "clear", "celsius": {rng.randrange(-5, 35)}}}'},
        ]
    return out


def run_sessions(
    router_url: str,
    instance_urls: list[str],
    *,
    sessions: int = 8,
    turns: int = 4,
    words: int = 40,
    pause_s: tuple[float, float] = (1.0, 2.0),
    churn_tokens: int = 600,
    vocab: int = 2000,
    block_size: int = 32,
    prefix: str = "s",
    seed: int = 0,
    model: str = "tiny",
) -> ScenarioResult:
    """`sessions` concurrent agent sessions of `turns` model calls each, through
    `router_url`, while other traffic cycles every instance's KV pool."""
    client = OpenAI(base_url=f"{router_url}/v1", api_key="unused", timeout=300, max_retries=0)
    stop = threading.Event()
    churned = [0]
    churn = threading.Thread(
        target=_churn, args=(list(instance_urls), stop, churned),
        kwargs={"tokens": churn_tokens, "vocab": vocab, "seed": seed + 7, "model": model},
        daemon=True,
    )
    started = time.monotonic()
    churn.start()
    try:
        with ThreadPoolExecutor(max_workers=sessions) as pool:
            futures = [
                pool.submit(_session, client, f"{prefix}{k}", turns=turns, words=words,
                            pause_s=pause_s, seed=seed + k, model=model)
                for k in range(sessions)
            ]
            results = [t for f in futures for t in f.result()]
    finally:
        stop.set()
        churn.join(timeout=120)
    return ScenarioResult(results, churned[0], time.monotonic() - started, block_size)


def format_turns(result: ScenarioResult, title: str) -> str:
    rows = [("session", "turn", "instance", "prev", "prompt", "prev full-block", "cached", "all?")]
    for t in result.resumed:
        rows.append((t.session, str(t.turn), t.instance, t.prev_instance or "-",
                     str(t.prompt_tokens), str(t.prev_full_block_tokens(result.block_size)),
                     str(t.cached_tokens), "yes" if t.reused_all(result.block_size) else "no"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [title] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append(f"summary: {result.summary()}")
    return "\n".join(lines)
