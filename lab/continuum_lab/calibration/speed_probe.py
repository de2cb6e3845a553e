"""How fast the machine is right now, against a cost model: a short probe
around each live replay.

A cost model is calibrated once; the shared machine's speed then drifts with
other people's jobs, by as much as 20% in a few hours (as large as the error
`predict` had to explain), and a checkout may run on another machine: one
ran twice as fast as the morning's calibration (docs/results/benchmarks-archive.md, "The
speed probe, a machine twice as fast"). So `compare` runs a few of calibrate's
probes (probes.py) on the freshly started server right before each replay,
and again right after it: a cold prefill, a prefill on a cached prefix (a
resumed turn), and a decode of a few streams, each repeated. The points are
recorded with the replay (`run.meta["speed_probe"]`); they take a few
seconds, their blocks stay cached (evictable) as the prefill profile's do,
and they carry no session, so no pin or TTL model learns from them.

`predict` reads them against its cost model: a replay's speed factor is the
geometric mean, over the points, of measured / the cost model's time (each
point's repeats by their median, as calibrate combines them), before and
after the replay together; the run's is the geometric mean of its
replays' (`run_speed`: one replay's probe is noisier than the drift within
a run). The cost model's step times and API overhead scaled by it are what
the run ran on. The factor is measured beside the replays, never fitted to
their outcome.
"""

from __future__ import annotations

import asyncio
import math
import statistics

import httpx

from continuum_lab.calibration.fit import combine_repeats, time_of
from continuum_lab.calibration.probes import (
    PROBE_ERRORS, Point, Prompts, decode_point, prefill_point)
from continuum_lab.sim.cost_model import CostModel

# (kind, args) as calibrate's grid (grid.py): prefill (new, cached), decode (batch, context).
# The decode's streams each have their own prefix, as calibrate's since it measures
# decode attention (replays before that recorded (4, 512) on one shared prefix).
PROBES = (("prefill", (512, 0)), ("prefill", (256, 1024)), ("decode", (4, 256)))
REPEATS = 3
DECODE_TOKENS = 48  # as calibrate's default: enough steps side by side on a fast machine
WHEN = ("before", "after")  # the replay's probes, as run.meta["speed_probe"] keys them


async def _measure(base_url: str, model: str, block_size: int, chunk: int,
                   seed: int) -> tuple[list[Point], list[str]]:
    """The points, and the probes that failed. The first request, a 16-token
    prefill, is a warm-up (a server's first requests pay one-off costs): not kept."""
    prompts = Prompts(seed)
    points, failed = [], []
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=300) as client:
        for i, (kind, args) in enumerate([("prefill", (16, 0)), *PROBES * REPEATS]):
            try:
                if kind == "prefill":
                    point = await prefill_point(client, model, prompts, *args, block_size, chunk)
                else:
                    point = await decode_point(client, model, prompts, *args, DECODE_TOKENS, block_size)
            except PROBE_ERRORS as exc:
                failed.append(f"{kind} {args}: {type(exc).__name__}: {exc}")
                continue
            if i:
                points.append(point)
    return points, failed


def probe_speed(base_url: str, *, seed: int) -> dict:
    """The probe's points on the server at base_url, as JSON (Point.to_json), and the
    probes that failed, each with its error: {"points": [...], "failed": [...]}. A
    failed probe is left out, never the replay's end; `speed_factor` reads what is left."""
    from continuum_lab.calibration.server import read_shape

    shape = read_shape(base_url, {})
    points, failed = asyncio.run(_measure(base_url, shape.model, shape.block_size,
                                          shape.max_num_batched_tokens, seed))
    for line in failed:
        print(f"[speed probe] left out: {line}", flush=True)
    return {"points": [p.to_json() for p in points], "failed": failed}


def coefficients(cost: CostModel) -> dict[str, float]:
    """A linear cost model's constants, by calibrate's TERMS."""
    return {**cost.linear.model_dump(), "api_overhead_s": cost.api_overhead_s}


def modelled_s(cost: CostModel, point: Point) -> float:
    """The point's time under the cost model (calibrate's fit, read the other way)."""
    return time_of(point, coefficients(cost))


def speed_factor(records: list[dict], cost: CostModel) -> float:
    """Geometric mean over the probe's points of measured / modelled: above 1, the
    machine ran slower than when the cost model was calibrated."""
    points = combine_repeats([Point.from_json(r) for r in records])
    ratios = [p.measured_s / m for p in points if (m := modelled_s(cost, p)) > 0 and p.measured_s > 0]
    if not ratios:
        raise ValueError("no speed-probe point to read")
    return statistics.geometric_mean(ratios)


def replay_speed(meta: dict, cost: CostModel) -> dict[str, float] | None:
    """A replay's speed factors (before, after, and both together), or None for a
    replay recorded without a probe or a cost model that is not linear."""
    probe = meta.get("speed_probe") or {}
    if cost.kind != "linear" or not all((probe.get(w) or {}).get("points") for w in WHEN):
        return None
    out = {w: speed_factor(probe[w]["points"], cost) for w in WHEN}
    out["replay"] = math.sqrt(out["before"] * out["after"])
    return out


def run_speed(speeds: list[dict[str, float] | None]) -> float | None:
    """The factor applied to every replay of a run: the geometric mean of its
    replays' (None where none was probed). One replay's probe is noisy (its before
    and after differed by up to 1.35x on an idle machine), more than the machine
    drifts within a run (stock's mean JCT within 1.07-1.10x over its rounds), so
    the run's probes are read together; each replay's stays in the report."""
    found = [s["replay"] for s in speeds if s is not None]
    return statistics.geometric_mean(found) if found else None


def scaled(cost: CostModel, factor: float) -> CostModel:
    """The cost model on a machine `factor` times slower (every constant scaled)."""
    linear = cost.linear.model_copy(update={k: v * factor for k, v in cost.linear.model_dump().items()})
    return cost.model_copy(update={"linear": linear, "api_overhead_s": cost.api_overhead_s * factor})
