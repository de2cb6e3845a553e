"""Does a step that mixes a prefill chunk with decodes take what the cost model
says, the sum of its parts? `calibrate` times prefills alone and decodes alone;
a replay's steps, stock's most, mix them. This times the mix on the CPU
benchmark's server (2 layers, 375 blocks, as `calibrate --bench-server 2`
starts it), with calibrate's own stream code:

- B decode streams start at context C; once their own prefills are done, a
  cold prefill of N tokens joins them;
- the mixed step is the streams' longest gap between tokens after the prefill
  was sent (median over streams), set beside the same prefill timed alone
  right after (its time to first token) and beside the cost model's time for
  one step of [N new] + B decodes.

    .venv/bin/python scripts/mixed_step_probe.py [COST_MODEL]

Measured 2026-12-02 (docs/benchmarks.md, "Mixed steps, preemptions, and
every step the server ran"): mixed / alone 1.03 median; a mixed step takes
what the prefill alone takes plus a decode step, as the model's sum says.
"""
import asyncio
import statistics
import sys
from pathlib import Path

import httpx

from continuum_lab.calibration.bench_server import bench_server
from continuum_lab.calibration.probes import Prompts, stream_completion
from continuum_lab.sim.cost_model import load_cost_model

POINTS = [(2048, 4, 2000), (1024, 4, 2000), (512, 4, 2000), (2048, 8, 1000)]  # (N, B, C)
REPEATS = 3
DECODE_TOKENS = 400
PREFILL_RATE = 2048 / 0.6  # tokens/s, generous: the streams' own prefills are done by then


async def mixed_step(client: httpx.AsyncClient, prompts: Prompts, n: int, batch: int,
                     context: int) -> float:
    decode = {"model": "tiny", "max_tokens": DECODE_TOKENS, "min_tokens": DECODE_TOKENS,
              "ignore_eos": True}

    async def joiner():
        await asyncio.sleep(batch * context / PREFILL_RATE + 0.8)
        return await stream_completion(client, {"model": "tiny", "prompt": prompts.fresh(n), "max_tokens": 1})

    (sent, _, _), *streams = await asyncio.gather(joiner(), *(
        stream_completion(client, {**decode, "prompt": prompts.fresh(context)}) for _ in range(batch)))
    gaps = [max(b - a for (a, _), (b, _) in zip(chunks, chunks[1:]) if b > sent)
            for _, chunks, _ in streams]
    return statistics.median(gaps)


async def alone(client: httpx.AsyncClient, prompts: Prompts, n: int) -> float:
    sent, chunks, _ = await stream_completion(
        client, {"model": "tiny", "prompt": prompts.fresh(n), "max_tokens": 1})
    return chunks[0][0] - sent


async def main(url: str, cost_model: str) -> None:
    model = load_cost_model(cost_model)
    prompts = Prompts(11)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        warm_up = {"model": "tiny", "prompt": prompts.fresh(16), "max_tokens": 2}
        await stream_completion(client, warm_up)
        for n, batch, context in POINTS:
            modelled = model.step_time([(n, 0)] + [(1, context + DECODE_TOKENS // 2)] * batch)
            for _ in range(REPEATS):
                measured = await mixed_step(client, prompts, n, batch, context)
                prefill = await alone(client, prompts, n)
                print(f"{n} new + {batch} decodes at {context}: {measured * 1000:.0f} ms; "
                      f"the prefill alone {prefill * 1000:.0f} ms (mixed / alone "
                      f"{measured / prefill:.2f}); modelled {modelled * 1000:.0f} ms ({cost_model}, "
                      f"measured / modelled {measured / modelled:.2f})", flush=True)


if __name__ == "__main__":
    with bench_server(2, 375, 4096, Path("runs/mixed-step-probe")) as url:
        asyncio.run(main(url, sys.argv[1] if len(sys.argv) > 1 else "cpu-bench-2l-noon"))
