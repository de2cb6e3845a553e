"""What `calibrate` prints: the server's shape, the fitted constants, every
point measured beside fitted, and the noise to read the fit's error against.

A fit's error means little alone on a shared machine: the report sets it
beside how far the repeats of one point differed, and shows the decode steps
under a grammar (not fitted; the simulator has no grammar) as a multiple of
the fitted free decode.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from continuum_lab.calibration.fit import Fit
from continuum_lab.calibration.probes import Point
from continuum_lab.calibration.server import ServerShape
from continuum_lab.markdown import table


def _points_table(fit: Fit) -> str:
    rows = []
    for p in sorted(fit.points, key=lambda p: (p.kind, sorted(p.params.items()))):
        reps = p.detail.get("repeats_s", [p.measured_s])
        rows.append([p.kind, ", ".join(f"{k} {v}" for k, v in p.params.items()), f"{p.measured_s:.4f}",
                     f"{min(reps):.4f}-{max(reps):.4f}", f"{fit.predicted(p):.4f}",
                     f"{fit.relative_error(p):+.1%}"])
    return table(["kind", "point", "measured s (median)", "repeats min-max s", "fitted s", "error"], rows)


def fit_report(fit: Fit, shape: ServerShape, not_measured: Sequence[str],
               guided: Sequence[Point] = ()) -> str:
    lines = ["server: " + ", ".join(f"{k} {v} ({shape.sources[k]})" for k, v in shape.values.items()),
             "fitted: " + ", ".join(f"{k} {v:.4g}" for k, v in fit.coefficients.items()), "",
             _points_table(fit), ""]
    for kind, e in fit.error_summary().items():
        lines.append(f"fit error, {kind}: mean |error| {e['mean_abs_relative_error']:.1%}, "
                     f"largest {e['max_abs_relative_error']:.1%} over {e['points']} points")
    spread = [max(r) / min(r) for p in fit.points if len(r := p.detail.get("repeats_s", [])) > 1]
    if spread:
        lines.append(f"repeats of one point differed by up to {max(spread):.2f}x "
                     f"(median {statistics.median(spread):.2f}x): the machine's noise, against which "
                     "to read the fit's error")
    for p in guided:
        lines.append(f"under a grammar (structured outputs, not simulated): B={p.params['batch']} "
                     f"C={p.params['context']} decodes a step in {p.measured_s:.4f} s, "
                     f"{p.measured_s / fit.predicted(p):.2f}x the fitted free decode")
    lines += [f"not measured: {s}" for s in not_measured]
    return "\n".join(lines)
