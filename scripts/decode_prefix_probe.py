"""Does `calibrate`'s decode probe understate a replay's decode? Its B streams
share one cached prefix; a replay's streams each have their own. This times
both side by side, alternating, on the CPU benchmark's server (2 layers, 375
blocks, as `calibrate --bench-server 2` starts it), with calibrate's own
probe code, and prints each point's step time.

    .venv/bin/python scripts/decode_prefix_probe.py

Measured 2026-12-02 (docs/benchmarks.md, "After the caps opened"): no
consistent difference; repeats of one point differ by up to 1.6x. Again with
the model worker on one thread, where repeats agree within about 10% ("One
core for the engine core"): own / shared 0.96-1.13x.
"""
import asyncio
from pathlib import Path

import httpx

from continuum_lab.calibration.bench_server import bench_server
from continuum_lab.calibration.probes import Prompts, decode_point, prefill_point

BLOCK = 32
CHUNK = 2048  # the server's max_num_batched_tokens
POINTS = [(2, 2040), (4, 2040), (8, 1024), (16, 512), (4, 1024)]  # (streams, context): B x C fits the pool


async def main(url: str) -> None:
    prompts = Prompts(7)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await prefill_point(client, "tiny", prompts, 64, 0, BLOCK, CHUNK)  # warm-up
        for batch, context in POINTS:
            for _ in range(2):
                for own in (False, True):
                    point = await decode_point(client, "tiny", prompts, batch, context, 48, BLOCK,
                                               shared_prefix=not own)
                    print(f"{batch} streams, context {context}, {'own' if own else 'shared'} "
                          f"prefix: {point.measured_s * 1000:.1f} ms per step", flush=True)


if __name__ == "__main__":
    with bench_server(2, 375, 4096, Path("runs/decode-prefix-probe")) as url:
        asyncio.run(main(url))
