"""`compare`'s report round by round: each round's figures beside that round's
stock, the outcome program by program, and the spread over rounds.

The machine is shared and its speed drifts, so a flavour is only ever set
against stock's run *of the same round*, and the report shows how much
stock itself moved between rounds (what a reader must not take for signal).
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


def stock_spread(stock: Sequence[dict]) -> str:
    """How much stock alone moved between rounds: the noise floor of every ratio."""
    return (f"stock alone (the machine's drift, not signal): mean JCT "
            f"{value_range([s['jct_mean_s'] for s in stock], '{:.2f}')}, makespan "
            f"{value_range([s['makespan_s'] for s in stock], '{:.1f}')} over {len(stock)} rounds")


def _ratios_to_stock(s: dict, base: dict, one_shot: bool) -> dict[str, float]:
    """A flavour's figures against its round's stock, as the spread lines take them."""
    out = {"stock / mean JCT": base["jct_mean_s"] / s["jct_mean_s"],
           "stock / makespan": base["makespan_s"] / s["makespan_s"]}
    if one_shot and base["one_shot_ttft_p99_s"] > 0:
        out["one-shot p99 TTFT / stock's"] = s["one_shot_ttft_p99_s"] / base["one_shot_ttft_p99_s"]
    return out


def round_table(rounds: Sequence[Sequence[RunResult]]) -> str:
    """Each round's figures and ratios to that round's stock (mean JCT, makespan;
    with one-shot traffic, its p99 TTFT), then the spread: each flavour's ratios
    over the rounds, and stock's own figures over the rounds."""
    one_shot = any(r.one_shot for rnd in rounds for r in rnd)
    head = ["round", "order", "run", "mean JCT s", "stock / mean JCT", "makespan s",
            "stock / makespan", "reuse of prev prompt"]
    head += ["one-shot p99 TTFT s", "one-shot p99 TTFT / stock's"] if one_shot else []
    rows: list[list[str]] = []
    ratios: dict[str, dict[str, list[float]]] = {}
    stock: list[dict] = []
    for i, rnd in enumerate(rounds, 1):
        sums = [summarize(r) for r in rnd]
        base = next((s for s in sums if s["label"] == STOCK), None)
        stock += [base] if base else []
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
                for what, value in _ratios_to_stock(s, base, one_shot).items():
                    mine.setdefault(what, []).append(value)
    lines = [table(head, rows)]
    lines += [""] if ratios or len(stock) > 1 else []
    for label, by_what in ratios.items():
        lines += [spread_line(label, what, values) for what, values in by_what.items()]
    if len(stock) > 1:
        lines.append(stock_spread(stock))
    return "\n".join(lines)


def round_outcomes(rounds: Sequence[Sequence[RunResult]]) -> str:
    """Each round's outcome table against that round's stock (continuum_lab/outcomes.py)."""
    tables = ((i, outcome_table(rnd, STOCK)) for i, rnd in enumerate(rounds, 1))
    return "\n\n".join(f"Round {i}. {t}" for i, t in tables if t)
