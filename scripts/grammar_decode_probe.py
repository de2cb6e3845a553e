"""What does a tool call written under a grammar cost a decode step?

Without client hints a replay's tool turn is written under structured
outputs, with a `logit_bias` on the call's fixed text (continuum_lab/live/
turn_body.py); calibrate's grammar probe times a plain `[0-9]{n}` regex. This
times B decode streams side by side, each on its own cached prefix of C tokens
(as in a replay), on the CPU benchmark's server (`calibrate --bench-server 2`'s),
with the streams' bodies varied, round-robin, so that the variants share the
machine's drift:

- free: ordinary text of a fixed length (a turn without a tool);
- digits: calibrate's grammar probe, `[0-9]{n}`;
- bias: free, with the tool call's logit_bias (about 20 ids);
- tool: the replay's tool-turn body, grammar and bias (turn_body);
- one-tool: one stream of B with the tool body, the rest free (a replay's mix);
- new-tools: the tool body, each stream's regex one the server has not seen
  (its digit count), as a replay's turns mostly are: a grammar compiled per
  request.

Beside each step time, the streams' median time to first token (their
prompts' prefixes are cached: 8 new tokens each), where a grammar's
compilation would show.

The step time is calibrate's (`steady_step_s`: inter-token time while all
decode). Printed beside the cost model's time for the step.

    .venv/bin/python scripts/grammar_decode_probe.py [COST_MODEL]

Measured 2026-12-02 on one model thread (docs/benchmarks.md, "One core for
the engine core"): every grammar variant 0.91-1.06x the free decode step; a
fresh grammar adds nothing visible to the time to first token.
"""
import asyncio
import itertools
import statistics
import sys
from pathlib import Path

import httpx

from continuum_lab.calibration.bench_server import bench_server
from continuum_lab.calibration.probes import Prompts, steady_step_s, stream_completion
from continuum_lab.live.replay import tool_call_texts
from continuum_lab.live.turn_body import turn_body
from continuum_lab.sim.cost_model import load_cost_model
from continuum_lab.trace_format import Turn

POINTS = [(4, 1500), (8, 1000), (8, 200)]  # (B, C)
TOKENS = 64
REPEATS = 3
FRESH = itertools.count(1)
VARIANTS = ("free", "digits", "bias", "tool", "one-tool", "new-tools")


async def point(client, prompts, call, call_id, variant, batch, context):
    prefixes = [prompts.fresh(context) for _ in range(batch)]
    for prefix in prefixes:
        await stream_completion(client, {"model": "tiny", "prompt": prefix, "max_tokens": 1})
    free = {"model": "tiny", "max_tokens": TOKENS, "min_tokens": TOKENS, "ignore_eos": True}

    def body(i):
        kind = {"one-tool": "tool" if i == 0 else "free", "new-tools": "tool"}.get(variant, variant)
        # new-tools: an output length (so a regex) no earlier request had
        length = TOKENS + (next(FRESH) if variant == "new-tools" else 0)
        tool_turn = Turn(new_tokens=0, output_tokens=length, tool=call.tool, tool_s=1.0)
        if kind == "free":
            return free
        if kind == "digits":
            return {"model": "tiny", "max_tokens": TOKENS,
                    "structured_outputs": {"regex": f"[0-9]{{{TOKENS}}}"}}
        if kind == "bias":
            return free | {"logit_bias": {str(i): 100.0 for i in {*call.head_ids, *call.tail_ids}}}
        tb = turn_body("tiny", [], tool_turn, session=f"s{i}", hints="none", call=call,
                       call_token_id=call_id)
        return {k: tb[k] for k in ("max_tokens", "structured_outputs", "logit_bias")} | {"model": "tiny"}

    results = await asyncio.gather(*(
        stream_completion(client, {**body(i), "prompt": prefix + prompts.fresh(8)})
        for i, prefix in enumerate(prefixes)))
    step, _ = steady_step_s([chunks for _, chunks, _ in results])
    return step, statistics.median(chunks[0][0] - sent for sent, chunks, _ in results)


async def main(url: str, cost_model: str) -> None:
    model = load_cost_model(cost_model)
    prompts = Prompts(17)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        calls, call_id = await tool_call_texts(client, "tiny", {"bash"})
        call = calls["bash"]
        await stream_completion(client, {"model": "tiny", "prompt": prompts.fresh(16), "max_tokens": 2})
        for batch, context in POINTS:
            times = {v: [] for v in VARIANTS}
            ttfts = {v: [] for v in VARIANTS}
            for _ in range(REPEATS):
                for v in VARIANTS:
                    step, ttft = await point(client, prompts, call, call_id, v, batch, context)
                    times[v].append(step)
                    ttfts[v].append(ttft)
            modelled = model.step_time([(1, context + 8 + TOKENS // 2)] * batch)
            free = statistics.median(times["free"])
            print(f"B={batch} C={context}: modelled {modelled * 1000:.1f} ms; " + "; ".join(
                f"{v} {statistics.median(t) * 1000:.1f} ms ({statistics.median(t) / free:.2f}x free, "
                f"TTFT {statistics.median(ttfts[v]) * 1000:.0f} ms)"
                for v, t in times.items()), flush=True)


if __name__ == "__main__":
    with bench_server(2, 375, 4096, Path("runs/grammar-decode-probe")) as url:
        asyncio.run(main(url, sys.argv[1] if len(sys.argv) > 1 else "cpu-bench-2l-noon"))
