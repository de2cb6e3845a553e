"""`vllm-continuum calibrate --url URL --out FILE`: measure, fit, write the cost model.

The grid (each point a probe, probes.py) spans what a step can hold on this
server: cold prefills of doubling lengths up to the context window (past
max_num_batched_tokens they run in chunks), prefills on top of a cached
prefix (a resumed turn), and decode steps of B streams at context C for the
(B, C) the pool and max_num_seqs allow. Points run in a seeded shuffled
order, so that a drift in the machine's speed does not line up with one
term of the model. The YAML gets the server's shape (server.py), the fitted
constants (fit.py), and a `calibration` section with the provenance: the
command, date, machine, its load average before and after, every point with
its fitted value, and the fit's error.
"""

from __future__ import annotations

import asyncio
import os
import platform
import random
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np
import yaml
from tqdm import tqdm

from vllm_continuum.experiments.calibration.fit import Fit, combine_repeats, fit_points
from vllm_continuum.experiments.calibration.probes import (
    DECODE_TAIL,
    GUIDED,
    Point,
    Prompts,
    decode_point,
    prefill_point,
)
from vllm_continuum.experiments.calibration.server import ServerShape, read_shape
from vllm_continuum.experiments.sim.cost_model import load_cost_model

METHOD = (
    "Measured over HTTP by `vllm-continuum calibrate` on an otherwise idle server. Prefill: "
    "time to first token of prompts nobody sent before (max_tokens 1), cold or after a cached "
    "prefix, = API overhead + the prefill's chunked steps. Decode: B streams at context C sharing "
    "a cached prefix; the step time is the inter-token time while all B decode (no API overhead "
    "in it); the same under a grammar is reported, not fitted. Fitted: step = step_s + per_token_s T + per_pair_s pairs + per_seq_s decodes "
    "(sim/cost_model.py), plus api_overhead_s per request's TTFT, by non-negative least squares "
    "on relative errors (experiments/calibration/fit.py)."
)


def doubling(top: int, start: int = 128) -> list[int]:
    out, n = [], start
    while n < top:
        out.append(n)
        n *= 2
    return [*out, top]


def decode_fits(shape: ServerShape, batch: int, context: int, tokens: int) -> bool:
    """Whether B streams at context C fit the pool: one copy of the shared prefix,
    each stream's own blocks, one block of slack."""
    bs = shape.block_size
    own = -(-(DECODE_TAIL + tokens) // bs) + 1
    return (batch <= shape.max_num_seqs and context + DECODE_TAIL + tokens <= shape.max_model_len
            and context // bs + batch * own + 1 <= shape.num_gpu_blocks - 1)


def plan(shape: ServerShape, *, lengths: Sequence[int] | None, batches: Sequence[int],
         contexts: Sequence[int] | None, repeats: int, decode_tokens: int,
         guided: bool = True) -> tuple[list, list[str]]:
    """The probes to run, as (kind, args) tuples, and the (B, C) left out and why."""
    top = shape.max_model_len - 16
    lengths = list(lengths or [16, *doubling(top)])
    contexts = list(contexts or sorted({128, top // 2, top - decode_tokens - DECODE_TAIL}))
    probes: list[tuple[str, tuple]] = [("prefill", (n, 0)) for n in lengths for _ in range(repeats)]
    for cached in sorted({top // 4, top // 2}):
        n = min(512, top - cached)
        probes += [("prefill", (n, cached))] * repeats
    skipped = []
    for b in batches:
        for c in contexts:
            if decode_fits(shape, b, c, decode_tokens):
                probes += [("decode", (b, c))] * repeats
                # The grammar's cost beside the free decode, at the shortest context.
                probes += [(GUIDED, (b, c))] * (repeats if guided and c == contexts[0] else 0)
            else:
                skipped.append(f"decode B={b} C={c}: beyond the pool ({shape.num_gpu_blocks} blocks), "
                               f"max_num_seqs or max_model_len")
    return probes, skipped


async def measure(base_url: str, shape: ServerShape, probes: list, *, decode_tokens: int,
                  seed: int, failed: list[str]) -> list[Point]:
    """Every probe's point; a probe that fails is left out and said in `failed`."""
    prompts = Prompts(seed)
    order = list(probes)
    random.Random(seed).shuffle(order)
    points: list[Point] = []
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=900) as client:
        for _ in range(2):  # warm-up: the first requests of a server pay one-off costs
            await prefill_point(client, shape.model, prompts, 16, 0, shape.block_size,
                                shape.max_num_batched_tokens)
        for kind, args in tqdm(order, desc="calibrate", unit="probe"):
            try:
                if kind == "prefill":
                    points.append(await prefill_point(client, shape.model, prompts, *args,
                                                      shape.block_size, shape.max_num_batched_tokens))
                else:
                    points.append(await decode_point(client, shape.model, prompts, *args,
                                                     decode_tokens, shape.block_size,
                                                     guided=kind == GUIDED))
            except RuntimeError as exc:
                failed.append(f"{kind} {args}: {exc}")
    return points


def machine() -> dict:
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    except OSError:
        pass
    return {"node": platform.node(), "system": platform.platform(), "cpu": cpu or platform.processor(),
            "cpu_count": os.cpu_count()}


def cost_model_data(name: str, shape: ServerShape, fit: Fit, calibration: dict) -> dict:
    return {
        "name": name,
        "description": (f"Calibrated on {calibration['url']} (model {shape.root}) by "
                        f"`{calibration['command']}` on {calibration['date']}. {METHOD}"),
        "kind": "linear",
        **{k: shape.values[k] for k in ("block_size", "num_gpu_blocks", "max_num_seqs",
                                         "max_num_batched_tokens", "max_model_len")},
        "linear": fit.linear.model_dump(),
        "api_overhead_s": fit.api_overhead_s,
        "calibration": calibration,
    }


def report(fit: Fit, shape: ServerShape, skipped: list[str], guided: Sequence[Point] = ()) -> str:
    lines = ["server: " + ", ".join(f"{k} {v} ({shape.sources[k]})" for k, v in shape.values.items()),
             "fitted: " + ", ".join(f"{k} {v:.4g}" for k, v in fit.coefficients.items()), "",
             "| kind | point | measured s (median) | repeats min-max s | fitted s | error |",
             "|---|---|---|---|---|---|"]
    for p in sorted(fit.points, key=lambda p: (p.kind, sorted(p.params.items()))):
        params = ", ".join(f"{k} {v}" for k, v in p.params.items())
        reps = p.detail.get("repeats_s", [p.measured_s])
        lines.append(f"| {p.kind} | {params} | {p.measured_s:.4f} | {min(reps):.4f}-{max(reps):.4f} | "
                     f"{fit.predicted(p):.4f} | {fit.predicted(p) / p.measured_s - 1:+.1%} |")
    lines.append("")
    for kind, e in fit.error_summary().items():
        lines.append(f"fit error, {kind}: mean |error| {e['mean_abs_relative_error']:.1%}, "
                     f"largest {e['max_abs_relative_error']:.1%} over {e['points']} points")
    spread = [max(r) / min(r) for p in fit.points if len(r := p.detail.get("repeats_s", [])) > 1]
    if spread:
        lines.append(f"repeats of one point differed by up to {max(spread):.2f}x "
                     f"(median {float(np.median(spread)):.2f}x): the machine's noise, against which "
                     "to read the fit's error")
    for p in guided:
        lines.append(f"under a grammar (structured outputs, not simulated): B={p.params['batch']} "
                     f"C={p.params['context']} decodes a step in {p.measured_s:.4f} s, "
                     f"{p.measured_s / fit.predicted(p):.2f}x the fitted free decode")
    lines += [f"not measured: {s}" for s in skipped]
    return "\n".join(lines)


def run_calibrate(url: str, out: Path, *, flags: dict[str, int | None], lengths: Sequence[int] | None,
                  batches: Sequence[int], contexts: Sequence[int] | None, repeats: int,
                  decode_tokens: int, seed: int = 0, guided: bool = True, command: str = "") -> int:
    shape = read_shape(url, flags)
    probes, skipped = plan(shape, lengths=lengths, batches=batches, contexts=contexts,
                           repeats=repeats, decode_tokens=decode_tokens, guided=guided)
    load_before = os.getloadavg()
    started = time.time()
    failed: list[str] = []
    points = asyncio.run(measure(url, shape, probes, decode_tokens=decode_tokens, seed=seed,
                                 failed=failed))
    combined = combine_repeats(points)
    fit = fit_points([p for p in combined if p.kind != GUIDED])
    guided_points = [p for p in combined if p.kind == GUIDED]
    calibration = {
        "command": command or "vllm-continuum calibrate",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "url": url,
        "model": shape.root,
        "machine": machine(),
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "duration_s": round(time.time() - started, 1),
        "method": METHOD,
        "shape_sources": shape.sources,
        "decode_tokens": decode_tokens,
        "fit_error": fit.error_summary(),
        "not_measured": skipped + failed,
        "points": [{**p.to_json(), "fitted_s": fit.predicted(p)} for p in fit.points],
        # Not fitted (the simulator has no grammar): decode steps under structured
        # outputs, against the fitted free decode of the same batch.
        "guided_decode": [{**p.to_json(), "free_decode_fitted_s": fit.predicted(p)}
                          for p in guided_points],
    }
    data = cost_model_data(Path(out).stem, shape, fit, calibration)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(yaml.safe_dump(data, sort_keys=False, width=100))
    load_cost_model(out)  # what `sim --cost-model` will read
    print(report(fit, shape, skipped + failed, guided_points))
    print(f"\nwrote {out}; simulate with it: vllm-continuum sim --cost-model {out}")
    return 0
