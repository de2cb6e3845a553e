"""Does `calibrate`'s decode probe understate a replay's decode? Its B streams
share one cached prefix; a replay's streams each have their own. This times
both side by side, alternating, on the CPU benchmark's server (2 layers, 375
blocks, as `calibrate --bench-server 2` starts it), with calibrate's own
probe code, and prints each point's step time.

    .venv/bin/python scripts/decode_prefix_probe.py

Measured 2026-12-02 (docs/benchmarks.md, "After the caps opened"): no
consistent difference; repeats of one point differ by up to 1.6x.
"""
import asyncio
from pathlib import Path

import httpx

from vllm_continuum.experiments.calibration import probes as P
from vllm_continuum.experiments.calibration.bench_server import bench_server

BLOCK = 32
POINTS = [(2, 2040), (4, 2040), (8, 1024), (16, 512), (4, 1024)]  # (streams, context): B x C fits the pool


async def point(client, prompts, batch: int, context: int, tokens: int, distinct: bool) -> float:
    n = context // BLOCK * BLOCK
    prefixes = [prompts.fresh(n) for _ in range(batch)] if distinct else [prompts.fresh(n)] * batch
    for prefix in dict.fromkeys(map(tuple, prefixes)):
        await P._warm(client, "tiny", list(prefix))
    body = {"model": "tiny", "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True}
    results = await asyncio.gather(*(
        P._stream(client, {**body, "prompt": prefix + prompts.fresh(P.DECODE_TAIL)}) for prefix in prefixes))
    return P.steady_step_s([chunks for _, chunks, _ in results])[0]


async def main(url: str) -> None:
    prompts = P.Prompts(7)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await P._warm(client, "tiny", prompts.fresh(64))
        for batch, context in POINTS:
            for _ in range(2):
                for distinct in (False, True):
                    s = await point(client, prompts, batch, context, 48, distinct)
                    print(f"{batch} streams, context {context}, {'own' if distinct else 'shared'} "
                          f"prefix: {s * 1000:.1f} ms per step", flush=True)


if __name__ == "__main__":
    with bench_server(2, 375, 4096, Path("runs/decode-prefix-probe")) as url:
        asyncio.run(main(url))
