"""`compare`'s report round by round: each round's figures beside that round's
baseline (stock; with a host tier, also stock + offload), the outcome
program by program, and the spread over rounds.

The machine is shared and its speed drifts, so a flavour is only ever set
against the baseline's run *of the same round*, and the report shows how
much the baseline itself moved between rounds (what a reader must not take
for signal).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from continuum_lab.live.flavours import STOCK
from continuum_lab.markdown import table
from continuum_lab.outcomes import outcome_table
from continuum_lab.report import ratio, summarize
from continuum_lab.results import RunResult


def value_range(values: Sequence[float], fmt: str) -> str:
    """'min-max (max / min r)': how far a figure moved over rounds."""
    return (f"{fmt.format(min(values))}-{fmt.format(max(values))} s "
            f"(max / min {max(values) / min(values):.2f}x)")


def spread_line(label: str, what: str, values: Sequence[float]) -> str:
    return (f"{label}: {what} by round {min(values):.2f}x to {max(values):.2f}x, "
            f"geometric mean {statistics.geometric_mean(values):.2f}x over {len(values)} rounds")


def baseline_spread(baseline: str, base: Sequence[dict]) -> str:
    """How much the baseline alone moved between rounds: the noise floor of every ratio."""
    return (f"{baseline} alone (the machine's drift, not signal): mean JCT "
            f"{value_range([s['jct_mean_s'] for s in base], '{:.2f}')}, makespan "
            f"{value_range([s['makespan_s'] for s in base], '{:.1f}')} over {len(base)} rounds")


def _ratios_to_base(s: dict, base: dict, baseline: str, one_shot: bool) -> dict[str, float]:
    """A flavour's figures against its round's baseline, as the spread lines take them."""
    out = {f"{baseline} / mean JCT": base["jct_mean_s"] / s["jct_mean_s"],
           f"{baseline} / makespan": base["makespan_s"] / s["makespan_s"]}
    if one_shot and base["one_shot_ttft_p99_s"] > 0:
        out[f"one-shot p99 TTFT / {baseline}'s"] = s["one_shot_ttft_p99_s"] / base["one_shot_ttft_p99_s"]
    return out


def round_table(rounds: Sequence[Sequence[RunResult]], baseline: str = STOCK) -> str:
    """Each round's figures and ratios to that round's baseline (mean JCT,
    makespan; with one-shot traffic, its p99 TTFT), then the spread: each
    flavour's ratios over the rounds, and the baseline's own figures over the rounds."""
    one_shot = any(r.one_shot for rnd in rounds for r in rnd)
    head = ["round", "order", "run", "mean JCT s", f"{baseline} / mean JCT", "makespan s",
            f"{baseline} / makespan", "reuse of prev prompt"]
    head += ["one-shot p99 TTFT s", f"one-shot p99 TTFT / {baseline}'s"] if one_shot else []
    rows: list[list[str]] = []
    ratios: dict[str, dict[str, list[float]]] = {}
    bases: list[dict] = []
    for i, rnd in enumerate(rounds, 1):
        sums = [summarize(r) for r in rnd]
        base = next((s for s in sums if s["label"] == baseline), None)
        bases += [base] if base else []
        order = " then ".join(r.label for r in rnd)
        for s in sums:
            cells = [str(i), order, s["label"], f"{s['jct_mean_s']:.2f}",
                     ratio(base["jct_mean_s"], s["jct_mean_s"]) if base else "",
                     f"{s['makespan_s']:.1f}",
                     ratio(base["makespan_s"], s["makespan_s"]) if base else "",
                     f"{s['reuse_of_prev_prompt']:.1%}"]
            if one_shot:
                cells += [f"{s['one_shot_ttft_p99_s']:.3f}",
                          ratio(s["one_shot_ttft_p99_s"], base["one_shot_ttft_p99_s"]) if base else ""]
            rows.append(cells)
            if base and s is not base and s["jct_mean_s"]:
                mine = ratios.setdefault(s["label"], {})
                for what, value in _ratios_to_base(s, base, baseline, one_shot).items():
                    mine.setdefault(what, []).append(value)
    lines = [table(head, rows)]
    lines += [""] if ratios or len(bases) > 1 else []
    for label, by_what in ratios.items():
        lines += [spread_line(label, what, values) for what, values in by_what.items()]
    if len(bases) > 1:
        lines.append(baseline_spread(baseline, bases))
    return "\n".join(lines)


def round_outcomes(rounds: Sequence[Sequence[RunResult]], baseline: str = STOCK) -> str:
    """Each round's outcome table against that round's baseline (continuum_lab/outcomes.py)."""
    tables = ((i, outcome_table(rnd, baseline)) for i, rnd in enumerate(rounds, 1))
    return "\n\n".join(f"Round {i}. {t}" for i, t in tables if t)
