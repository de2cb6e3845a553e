"""The linear step model, fitted to the probes' points, and how well it fits.

Each point is a sum of engine steps (one decode step; one or more prefill
chunks) plus, for a time to first token, one request's API overhead. The
linear cost model (sim/cost_model.py) is linear in its constants, so a
point's predicted time is a dot product:

    [steps, sum T, sum pairs, sum decodes, sum decode_kv, overhead?]
        . [step_s, per_token_s, per_pair_s, per_seq_s, per_decode_kv_s, api_overhead_s]

with the features read by the same `StepFeatures` the simulator uses. The
constants are fitted by least squares on relative errors (each row divided
by its measured time: a 50 ms decode step weighs as much as a 3 s prefill),
constrained to be non-negative: a term that comes out negative is dropped
(held at 0) and the rest refitted, until none is (a term the data cannot
see, such as attention on a tiny model, ends at 0 rather than making
another term absorb its sign). The error is reported per point, and as the
mean and largest relative error of prefill and decode points apart.

On a shared machine one repeat can take several times another (another
process took the core). The repeats of a grid point are combined first, by
their median, so that one such spike neither drags the fit nor hides: each
point keeps its repeats (`detail["repeats_s"]`), and the report shows their
spread beside the fit's error, the noise floor the error must be read against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from continuum_lab.calibration.probes import Point
from continuum_lab.sim.cost_model import Linear, StepFeatures

TERMS = ("step_s", "per_token_s", "per_pair_s", "per_seq_s", "per_decode_kv_s", "api_overhead_s")


def features(point: Point) -> dict[str, float]:
    """What each constant of TERMS is multiplied by in the point's time."""
    total = sum((StepFeatures.of(batch) for batch in point.steps), StepFeatures.of(()))
    return {"step_s": float(len(point.steps)), "per_token_s": total.tokens, "per_pair_s": total.pairs,
            "per_seq_s": total.decodes, "per_decode_kv_s": total.decode_kv,
            "api_overhead_s": float(point.overhead)}


def time_of(point: Point, coefficients: dict[str, float]) -> float:
    """The point's time under the constants of TERMS (a fit's, or a cost model's)."""
    return sum(value * coefficients[term] for term, value in features(point).items())


@dataclass
class Fit:
    coefficients: dict[str, float]
    points: list[Point]

    @property
    def linear(self) -> Linear:
        return Linear(**{k: v for k, v in self.coefficients.items() if k != "api_overhead_s"})

    @property
    def api_overhead_s(self) -> float:
        return self.coefficients["api_overhead_s"]

    def predicted(self, point: Point) -> float:
        return time_of(point, self.coefficients)

    def relative_error(self, point: Point) -> float:
        """predicted / measured - 1."""
        return self.predicted(point) / point.measured_s - 1

    def relative_errors(self, kind: str | None = None) -> list[float]:
        return [self.relative_error(p) for p in self.points if kind is None or p.kind == kind]

    def error_summary(self) -> dict:
        out = {}
        for kind in ("prefill", "decode", None):
            errs = np.abs(self.relative_errors(kind))
            if errs.size:
                out[kind or "all"] = {"points": int(errs.size), "mean_abs_relative_error": float(errs.mean()),
                                      "max_abs_relative_error": float(errs.max())}
        return out


def combine_repeats(points: Sequence[Point]) -> list[Point]:
    """One point per grid point (kind and params): the median of its repeats' times,
    with the steps of the repeat at the median (a decode repeat's batch is what ran
    side by side, which may differ between repeats), every repeat's time in
    detail["repeats_s"]."""
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        groups.setdefault((p.kind, tuple(sorted(p.params.items()))), []).append(p)
    out = []
    for same in groups.values():
        times = [p.measured_s for p in same]
        middle = sorted(same, key=lambda p: p.measured_s)[(len(same) - 1) // 2]
        out.append(Point(middle.kind, middle.params, middle.steps, float(np.median(times)),
                         middle.overhead, {**middle.detail, "repeats_s": times}))
    return out


def fit_points(points: Sequence[Point]) -> Fit:
    """Non-negative least squares on relative errors, by dropping negative terms."""
    if len(points) < len(TERMS):
        raise ValueError(f"{len(points)} points cannot fit {len(TERMS)} constants: measure more")
    x = np.array([[features(p)[t] for t in TERMS] for p in points])
    y = np.array([p.measured_s for p in points])
    weights = 1.0 / np.maximum(y, 1e-6)
    xw, yw = x * weights[:, None], y * weights
    active = [i for i in range(len(TERMS)) if x[:, i].any()]
    solution = np.zeros(0)
    while active:
        solution, *_ = np.linalg.lstsq(xw[:, active], yw, rcond=None)
        negative = [i for i, c in zip(active, solution) if c < 0]
        if not negative:
            break
        active.remove(min(negative, key=lambda i: solution[active.index(i)]))
    coefficients = dict.fromkeys(TERMS, 0.0)
    coefficients.update({TERMS[i]: float(c) for i, c in zip(active, solution)})
    return Fit(coefficients, list(points))
