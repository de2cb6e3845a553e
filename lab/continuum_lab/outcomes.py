"""Fairness judged by outcome: who finishes later than on the baseline (stock
vLLM), and by how much, on the same trace.

A scheduling change is judged program by program: each program's JCT under
the policy over the same program's JCT on the baseline (programs are matched
by id; both runs replay one trace). What it reports:

- `programs_slower_10pct`: the share of programs more than 10% slower;
- `worst_program_ratio`, `median_program_ratio`: their JCT ratios (policy /
  baseline: above 1 is slower);
- one-shot requests (no session): p50 and p99 of TTFT and latency, each over
  the baseline's;
- `makespan_ratio`: baseline makespan / the policy's (above 1: the batch of
  programs finished sooner, i.e. more throughput).

Waiting to be admitted is not in itself unfair: under overload a program that
waits for the pool to stop thrashing finishes sooner. What matters is when
it finishes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from continuum_lab.report import makespan_s, percentile
from continuum_lab.results import RunResult

SLOWER = 1.10  # a program is "slower" beyond this JCT ratio to the baseline


def geomean(xs: Sequence[float]) -> float:
    """The geometric mean of the positive, finite values (NaN if none)."""
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def _over(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else float("nan")


def program_outcome(jct_s: dict[str, float], base_jct_s: dict[str, float]) -> dict:
    """The program-by-program figures from each program's JCT in both runs."""
    ratios = [jct / base_jct_s[p] for p, jct in jct_s.items() if base_jct_s.get(p, 0) > 0]
    return {
        "programs_compared": len(ratios),
        "programs_slower_10pct": (sum(r > SLOWER for r in ratios) / len(ratios)
                                  if ratios else float("nan")),
        "worst_program_ratio": max(ratios, default=float("nan")),
        "median_program_ratio": percentile(ratios, 50),
    }


def outcome(run: RunResult, base: RunResult) -> dict:
    """How `run` went for everyone against `base` (the same trace)."""
    mine = {"ttft": [t.ttft_s for t in run.one_shot], "latency": [t.latency_s for t in run.one_shot]}
    theirs = {"ttft": [t.ttft_s for t in base.one_shot],
              "latency": [t.latency_s for t in base.one_shot]}
    out = {
        "label": run.label,
        **program_outcome({p.program: p.jct_s for p in run.programs},
                          {p.program: p.jct_s for p in base.programs}),
        "makespan_ratio": _over(makespan_s(base), makespan_s(run)),
    }
    for what in ("ttft", "latency"):
        for q in (50, 99):
            out[f"one_shot_{what}_p{q}_ratio"] = _over(percentile(mine[what], q), percentile(theirs[what], q))
    out["one_shot_latency_mean_ratio"] = _over(_mean(mine["latency"]), _mean(theirs["latency"]))
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


COLUMNS = [
    ("label", "run", "{}"),
    ("programs_slower_10pct", "programs >10% slower", "{:.0%}"),
    ("worst_program_ratio", "worst program JCT / base", "{:.2f}x"),
    ("median_program_ratio", "median program JCT / base", "{:.2f}x"),
    ("makespan_ratio", "base makespan / makespan", "{:.2f}x"),
]
ONE_SHOT_COLUMNS = [
    ("one_shot_ttft_p50_ratio", "one-shot p50 TTFT / base", "{:.2f}x"),
    ("one_shot_ttft_p99_ratio", "one-shot p99 TTFT / base", "{:.2f}x"),
    ("one_shot_latency_p50_ratio", "one-shot p50 latency / base", "{:.2f}x"),
    ("one_shot_latency_p99_ratio", "one-shot p99 latency / base", "{:.2f}x"),
]


def _cell(value, fmt: str) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    return fmt.format(value)


def outcome_table(runs: Sequence[RunResult], baseline: str) -> str:
    """Markdown: each run's outcome against the run labelled `baseline` ('' if absent)."""
    base = next((r for r in runs if r.label == baseline), None)
    if base is None:
        return ""
    rows = [outcome(r, base) for r in runs if r.label != baseline]
    columns = COLUMNS + (ONE_SHOT_COLUMNS if base.one_shot else [])
    lines = [f"Outcome against {baseline}, program by program (same trace):", "",
             "| " + " | ".join(title for _, title, _ in columns) + " |",
             "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[key], fmt) for key, _, fmt in columns) + " |")
    return "\n".join(lines)
