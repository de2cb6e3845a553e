"""The main demo: concurrent agent sessions through the agent service, on a
continuum vLLM server (or stock vLLM, for comparison).

It builds the tiny model, starts vLLM (`--scheduler-cls continuum`, or the
stock scheduler), starts the agent HTTP service in this process, and runs
several agent sessions at once over HTTP. Each turn forces tool calls for
its first steps (a random-weight model calls tools only under guided
decoding) and answers in its last. The tools take realistic time
(`get_weather`'s latency is long-tailed, `book_hotel` sometimes fails), and
other users' requests keep flowing into the same server meanwhile, filling
its small KV pool. Every model call is then printed with its time to first
token and its prompt vs cached tokens: on continuum a step that follows a
tool call finds its session's KV blocks pinned; on stock vLLM the other
traffic has usually evicted them. Everything started is stopped at the end.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from openai import AsyncOpenAI
from tqdm import tqdm

from vllm_continuum.agent.demo_tools import CITIES, DemoToolConfig, demo_registry
from vllm_continuum.agent.loop import AgentLoop, LoopConfig
from vllm_continuum.agent.runner import ServiceThread
from vllm_continuum.agent.service import AgentService, create_app
from vllm_continuum.tools.local_server import BLOCK_SIZE, flavour_server
from vllm_continuum.tools.tiny_model import build_tiny_model

__all__ = ["AgentDemoConfig", "format_report", "run_agent_demo"]

# A fixed TTL shows the mechanism (see pause_demo.py: on a CPU with the tiny model
# the cost model would rightly pin almost nothing).
DEMO_SETTINGS = {
    "ttl_policy": "fixed",
    "default_ttl_s": 30,
}
SYSTEM = (
    "You are a travel agent. Use the tools to check the weather, do the arithmetic of the "
    "budget and book hotels, then answer the traveller."
)
_WORDS = (
    "trip budget hotel night flight museum river weather forecast rain sun city walk dinner "
    "train ticket price euro yen market bridge tower garden beach mountain day week"
).split()


@dataclass(frozen=True)
class AgentDemoConfig:
    sessions: int = 4  # concurrent agent sessions
    turns: int = 2  # user turns per session
    tool_steps: int = 2  # forced tool steps per turn, then one answer step
    note_words: int = 60  # length of each user message's notes (prompt size)
    num_blocks: int = 192  # the server's KV pool, in 32-token blocks
    background_tokens: int = 900  # other users: prompt length of each request
    background_workers: int = 2  # other users: requests in flight at once
    tools: DemoToolConfig = DemoToolConfig(weather_median_s=0.8, hotel_latency_s=0.5)
    seed: int = 0


def run_agent_demo(
    model_dir: Path,
    out_dir: Path = Path("runs/agent-demo"),
    *,
    stock: bool = False,
    config: AgentDemoConfig | None = None,
) -> int:
    """Run the demo on continuum (or on stock vLLM with `stock=True`); print
    the per-step table and the summary. Returns a process exit code."""
    cfg = config or AgentDemoConfig()
    flavour = "stock" if stock else "continuum"
    out_dir = Path(out_dir)
    model = str(build_tiny_model(model_dir))
    server = flavour_server(flavour, model, out_dir, num_blocks=cfg.num_blocks,
                            settings=DEMO_SETTINGS)
    total = cfg.sessions * cfg.turns
    with tqdm(total=total, desc=f"agent demo ({flavour})", unit="turn") as bar:
        thread: ServiceThread | None = None
        try:
            bar.set_postfix_str(f"starting the {flavour} vLLM server (log: {server.log_path})")
            server.start().wait_ready()
            client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused",
                                 timeout=300, max_retries=0)
            loop = AgentLoop(client, demo_registry(cfg.tools), LoopConfig(
                model="tiny", max_steps=cfg.tool_steps + 1, max_tokens=64,
                parallel_tool_calls=False, temperature=0.8, block_size=BLOCK_SIZE,
            ))
            thread = ServiceThread(create_app(AgentService(loop))).start()
            bar.set_postfix_str(f"{cfg.sessions} sessions through {thread.base_url}")
            results, background = asyncio.run(_drive(thread.base_url, server.base_url, cfg, bar))
        finally:
            if thread is not None:
                thread.stop()
            server.stop()
    report = format_report(flavour, results, background, cfg)
    print(report)
    print(f"\nvLLM log: {server.log_path}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"agent-demo-{flavour}.json").write_text(json.dumps(results, indent=1))
    failed = [r for r in results if r["finish_reason"] == "model_error"]
    return 1 if failed else 0


async def _drive(
    service_url: str, vllm_url: str, cfg: AgentDemoConfig, bar: tqdm
) -> tuple[list[dict[str, Any]], int]:
    stop = asyncio.Event()
    sent = [0]
    async with httpx.AsyncClient(base_url=service_url, timeout=600) as http:
        others = [asyncio.create_task(_other_users(vllm_url, cfg, stop, sent, cfg.seed + 100 + i))
                  for i in range(cfg.background_workers)]
        try:
            per_session = await asyncio.gather(
                *(_session(http, f"s{i + 1}", cfg, bar, cfg.seed + i) for i in range(cfg.sessions))
            )
        finally:
            stop.set()
            await asyncio.gather(*others, return_exceptions=True)
    return [r for rs in per_session for r in rs], sent[0]


async def _session(
    http: httpx.AsyncClient, label: str, cfg: AgentDemoConfig, bar: tqdm, seed: int
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    r = await http.post("/sessions", json={"system": SYSTEM})
    r.raise_for_status()
    sid = r.json()["id"]
    results = []
    try:
        for turn in range(cfg.turns):
            notes = " ".join(rng.choice(_WORDS) for _ in range(cfg.note_words))
            city = rng.choice(CITIES)
            content = f"My notes: {notes}\nPlan day {turn + 1} in {city}."
            r = await http.post(f"/sessions/{sid}/messages", json={
                "content": content,
                "tool_choice": ["required"] * cfg.tool_steps + ["none"],
            })
            if r.status_code not in (200, 502):
                r.raise_for_status()
            results.append({"session": label, **r.json()})
            bar.update()
    finally:
        await http.delete(f"/sessions/{sid}")
    return results


async def _other_users(
    vllm_url: str, cfg: AgentDemoConfig, stop: asyncio.Event, sent: list[int], seed: int
) -> None:
    """Unrelated requests with distinct prompts: they take KV blocks from the
    free pool, which is where stock vLLM parks a paused session's blocks."""
    rng = random.Random(seed)
    async with AsyncOpenAI(base_url=f"{vllm_url}/v1", api_key="unused", timeout=300,
                           max_retries=0) as client:
        while not stop.is_set():
            prompt = [rng.randrange(300, 1900) for _ in range(cfg.background_tokens)]
            try:
                await client.completions.create(model="tiny", prompt=prompt, max_tokens=1)
                sent[0] += 1
            except Exception:  # noqa: BLE001 - background noise; the demo goes on
                await asyncio.sleep(0.5)


def format_report(
    flavour: str, results: list[dict[str, Any]], background: int, cfg: AgentDemoConfig
) -> str:
    header = ("session", "turn", "step", "tool called -> outcome (s)", "TTFT ms", "prompt",
              "cached", "pin resumed*")
    rows = [header]
    resumed_calls: list[dict[str, Any]] = []
    all_calls: list[dict[str, Any]] = []
    outcomes: dict[str, int] = {}
    for res in sorted(results, key=lambda r: (r["session"], r["trace"]["turn"])):
        trace = res["trace"]
        tools_by_step: dict[int, list[dict[str, Any]]] = {}
        for t in trace["tool_calls"]:
            tools_by_step.setdefault(t["step"], []).append(t)
            outcomes[t["outcome"]] = outcomes.get(t["outcome"], 0) + 1
        for call in trace["model_calls"]:
            all_calls.append(call)
            if call["after_tool_step"]:
                resumed_calls.append(call)
            done = tools_by_step.get(call["step"], [])
            if call.get("error"):
                what = "model error"
            elif done:
                what = ", ".join(f"{t['name']} -> {t['outcome']} ({t['duration_s']:.2f})"
                                 for t in done)
            else:
                what = "(answer)"
            pin = call["pin_resumed"]
            rows.append((
                res["session"], str(trace["turn"]), str(call["step"]), what,
                f"{call['ttft_s'] * 1000:.0f}" if call["ttft_s"] is not None else "-",
                str(call["prompt_tokens"] or "-"), str(call["cached_tokens"] or 0),
                "-" if pin is None else ("yes" if pin else "NO"),
            ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"Agent demo on {flavour} vLLM: {cfg.sessions} concurrent sessions x {cfg.turns} "
             f"turns x ({cfg.tool_steps} tool steps + 1 answer), KV pool {cfg.num_blocks} "
             f"blocks of {BLOCK_SIZE} tokens, {background} requests of other users meanwhile", ""]
    lines += ["  ".join(c.rjust(w) if i in (4, 5, 6) else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths))) for row in rows[:1]]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) if i in (4, 5, 6) else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths))) for row in rows[1:]]
    lines.append(
        f"* inferred by the client: cached tokens >= the previous step's whole prompt in full "
        f"{BLOCK_SIZE}-token blocks\n  ('-': the step follows the user, not a tool call). "
        "TTFT is measured on the streamed response (first chunk)."
    )

    def ratio(calls: list[dict[str, Any]]) -> str:
        prompt = sum(c["prompt_tokens"] or 0 for c in calls)
        cached = sum(c["cached_tokens"] or 0 for c in calls)
        return f"{cached}/{prompt} = {cached / prompt:.0%}" if prompt else "n/a"

    found = [c for c in resumed_calls if c["pin_resumed"]]
    judged = [c for c in resumed_calls if c["pin_resumed"] is not None]

    def ttft(calls: list[dict[str, Any]]) -> str:
        values = [c["ttft_s"] * 1000 for c in calls if c["ttft_s"] is not None]
        return f"{statistics.median(values):.0f} ms" if values else "n/a"

    lines += [
        "",
        "Summary",
        f"  steps after a tool call that found their previous prompt cached "
        f"(pin resumed*): {len(found)}/{len(judged)}",
        f"  cached/prompt tokens, steps after a tool call: {ratio(resumed_calls)}",
        f"  cached/prompt tokens, all model calls:         {ratio(all_calls)}",
        f"  median TTFT after a tool call: {ttft(resumed_calls)} "
        f"(pin found: {ttft(found)}, not found: "
        f"{ttft([c for c in judged if not c['pin_resumed']])})",
        "  tool calls: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())),
        "  turns: " + ", ".join(
            f"{k} {v}" for k, v in sorted(Counter(r["finish_reason"] for r in results).items())
        ),
    ]
    return "\n".join(lines)


