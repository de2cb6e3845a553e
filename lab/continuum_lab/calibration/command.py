"""`vllm-continuum calibrate --url URL --out FILE`: measure, fit, write the cost model.

The grid's probes (grid.py) run in a seeded shuffled order, so that a drift
in the machine's speed does not line up with one term of the model; a probe
that fails is left out and listed rather than ending minutes of measurement.
The YAML gets the server's shape (server.py), the fitted constants (fit.py),
and a `calibration` section with the provenance: the command, date, machine,
its load average before and after, every point with its fitted value, and
the fit's error. What it prints: fit_report.py.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import yaml
from tqdm import tqdm

from continuum_lab.calibration.fit import TERMS, Fit, combine_repeats, fit_points
from continuum_lab.calibration.fit_report import fit_report
from continuum_lab.calibration.grid import Probe, plan
from continuum_lab.calibration.probes import (
    GUIDED, PROBE_ERRORS, Point, Prompts, decode_point, prefill_point)
from continuum_lab.calibration.server import FIELDS, ServerShape, read_shape
from continuum_lab.machine import load_average, machine
from continuum_lab.publish import utc_date
from continuum_lab.sim.cost_model import load_cost_model

METHOD = (
    "Measured over HTTP by `vllm-continuum calibrate` on an otherwise idle server. Prefill: "
    "time to first token of prompts nobody sent before (max_tokens 1), cold or after a cached "
    "prefix, = API overhead + the prefill's chunked steps. Decode: B streams, each at context C "
    "on its own cached prefix; the step time is the inter-token time while all B decode (no API "
    "overhead in it); the same under a grammar is reported, not fitted. Fitted: step = step_s + "
    "per_token_s T + per_pair_s pairs + per_seq_s decodes + per_decode_kv_s (KV entries the decodes "
    "read) (sim/cost_model.py), plus api_overhead_s per request's "
    "TTFT, by non-negative least squares on relative errors (continuum_lab/calibration/fit.py)."
)
WARM_UP_REQUESTS = 2  # a server's first requests pay one-off costs: not part of any point


async def measure(base_url: str, shape: ServerShape, probes: Sequence[Probe], *, decode_tokens: int,
                  seed: int) -> tuple[list[Point], list[str]]:
    """Every probe's point, and the probes that failed (each with its error)."""
    prompts = Prompts(seed)
    order = list(probes)
    random.Random(seed).shuffle(order)
    points: list[Point] = []
    failed: list[str] = []
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=900) as client:
        try:
            for _ in range(WARM_UP_REQUESTS):
                await prefill_point(client, shape.model, prompts, 16, 0, shape.block_size,
                                    shape.max_num_batched_tokens)
        except PROBE_ERRORS as exc:
            raise SystemExit(f"the server at {base_url} failed a 16-token completion "
                             f"({type(exc).__name__}: {exc}): check its log, then run again") from exc
        for kind, args in tqdm(order, desc="calibrate", unit="probe"):
            try:
                if kind == "prefill":
                    points.append(await prefill_point(client, shape.model, prompts, *args,
                                                      shape.block_size, shape.max_num_batched_tokens))
                else:
                    points.append(await decode_point(client, shape.model, prompts, *args,
                                                     decode_tokens, shape.block_size,
                                                     guided=kind == GUIDED))
            except PROBE_ERRORS as exc:
                failed.append(f"{kind} {args}: {type(exc).__name__}: {exc}")
    return points, failed


def fit_measured(points: Sequence[Point], failed: Sequence[str]) -> Fit:
    """The fit, or an exit that says what failed when too few points were measured."""
    try:
        return fit_points(points)
    except ValueError as exc:
        why = f" ({len(failed)} probes failed, e.g. {failed[0]})" if failed else ""
        raise SystemExit(f"{len(points)} grid points measured{why}: too few to fit {len(TERMS)} "
                         "constants; check the server (its log), then run again, with more "
                         "--lengths or --batches if the grid was small") from exc


def cost_model_data(name: str, shape: ServerShape, fit: Fit, calibration: dict) -> dict:
    return {
        "name": name,
        "description": (f"Calibrated on {calibration['url']} (model {shape.root}) by "
                        f"`{calibration['command']}` on {calibration['date']}. {METHOD}"),
        "kind": "linear",
        **{k: shape.values[k] for k in FIELDS},
        "linear": fit.linear.model_dump(),
        "api_overhead_s": fit.api_overhead_s,
        "calibration": calibration,
    }


def run_calibrate(url: str, out: Path, *, flags: dict[str, int | None], lengths: Sequence[int] | None,
                  batches: Sequence[int], contexts: Sequence[int] | None, repeats: int,
                  decode_tokens: int, seed: int = 0, guided: bool = True, command: str = "",
                  server_env: dict[str, str] | None = None) -> int:
    """`server_env`: the environment calibrate started the server with (--bench-server),
    recorded with the calibration."""
    shape = read_shape(url, flags)
    probes, skipped = plan(shape, lengths=lengths, batches=batches, contexts=contexts,
                           repeats=repeats, decode_tokens=decode_tokens, guided=guided)
    load_before = load_average()
    started = time.time()
    points, failed = asyncio.run(measure(url, shape, probes, decode_tokens=decode_tokens, seed=seed))
    combined = combine_repeats(points)
    fit = fit_measured([p for p in combined if p.kind != GUIDED], failed)
    guided_points = [p for p in combined if p.kind == GUIDED]
    calibration = {
        "command": command or "vllm-continuum calibrate",
        "date": utc_date(started),
        "url": url,
        "model": shape.root,
        "machine": machine(),
        **({"server_env": server_env} if server_env else {}),
        "load_average_before_after": [load_before, load_average()],
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
    load_cost_model(out)  # what `sim --cost-model` will read: fail here, not there
    print(fit_report(fit, shape, skipped + failed, guided_points))
    print(f"\nwrote {out}; simulate with it: vllm-continuum sim --cost-model {out}")
    return 0
