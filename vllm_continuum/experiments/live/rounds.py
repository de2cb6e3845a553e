"""`compare`'s rounds: each on disk, each round's figures beside that round's
stock, and the spread over rounds.

The machine is shared and its speed drifts, so a flavour is only ever set
against stock's run *of the same round*, and the report shows how much
stock itself moved between rounds (what a reader must not take for signal).

On disk, each replay of a round is `rounds/rN-FLAVOUR/`: its records
(`results.json`, with the server's continuum settings in the run's meta) and
the trace it sent (`sent-trace.jsonl`, sent_trace.py), which `vllm-continuum
predict` replays in the simulator.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_continuum.experiments.live.sent_trace import sent_trace
from vllm_continuum.experiments.outcomes import outcome_table
from vllm_continuum.experiments.report import ratio, summarize, write_runs
from vllm_continuum.experiments.results import RunResult
from vllm_continuum.experiments.trace_format import Trace

ROUNDS_DIR = "rounds"
SENT_TRACE = "sent-trace.jsonl"


@dataclass
class RoundRecord:
    round: int
    run: RunResult
    sent: Trace

    @property
    def label(self) -> str:
        return self.run.label


def save_round(run: RunResult, planned: Trace, out_dir: Path) -> Path:
    """One replay of a round (run.meta["round"] set), and the trace it sent."""
    where = Path(out_dir) / ROUNDS_DIR / f"r{run.meta['round']}-{run.label}"
    write_runs([run], where)
    sent_trace(run, planned).save(where / SENT_TRACE)
    return where


def load_rounds(out_dir: Path) -> list[RoundRecord]:
    """Every recorded replay of a `compare` run, by round then in the order they ran."""
    base = Path(out_dir) / ROUNDS_DIR
    if not base.is_dir():
        raise FileNotFoundError(
            f"{out_dir} has no {ROUNDS_DIR}/: not a `compare` output directory, or one written "
            "before compare recorded its rounds; run compare again")
    records = []
    for where in base.iterdir():
        data = json.loads((where / "results.json").read_text())
        run = RunResult.from_json(data["runs"][0])
        records.append(RoundRecord(int(run.meta["round"]), run, Trace.load(where / SENT_TRACE)))
    return sorted(records, key=lambda r: (r.round, r.run.started_at, r.label))


def _geo(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def spread_line(label: str, what: str, values: Sequence[float]) -> str:
    return (f"{label}: {what} by round {min(values):.2f}x to {max(values):.2f}x, "
            f"geometric mean {_geo(values):.2f}x over {len(values)} rounds")


def round_table(rounds: Sequence[Sequence[RunResult]]) -> str:
    """Each round's figures and ratios to that round's stock (mean JCT, makespan;
    with one-shot traffic, its p99 TTFT), then the spread: each flavour's ratios
    over the rounds, and stock's own figures over the rounds."""
    one_shot = any(r.one_shot for rnd in rounds for r in rnd)
    head = ["round", "order", "run", "mean JCT s", "stock / mean JCT", "makespan s",
            "stock / makespan", "reuse of prev prompt"]
    head += ["one-shot p99 TTFT s", "one-shot p99 TTFT / stock's"] if one_shot else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios: dict[str, dict[str, list[float]]] = {}
    stock: list[dict] = []
    for i, rnd in enumerate(rounds, 1):
        sums = [summarize(r) for r in rnd]
        base = next((s for s in sums if s["label"] == "stock"), None)
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
            lines.append("| " + " | ".join(cells) + " |")
            if base and s is not base and s["jct_mean_s"]:
                mine = ratios.setdefault(s["label"], {})
                mine.setdefault("stock / mean JCT", []).append(base["jct_mean_s"] / s["jct_mean_s"])
                mine.setdefault("stock / makespan", []).append(base["makespan_s"] / s["makespan_s"])
                if one_shot and base["one_shot_ttft_p99_s"] > 0:
                    mine.setdefault("one-shot p99 TTFT / stock's", []).append(
                        s["one_shot_ttft_p99_s"] / base["one_shot_ttft_p99_s"])
    lines += [""] if ratios or len(stock) > 1 else []
    for label, by_what in ratios.items():
        lines += [spread_line(label, what, values) for what, values in by_what.items()]
    if len(stock) > 1:
        lines.append(stock_spread(stock))
    return "\n".join(lines)


def stock_spread(stock: Sequence[dict]) -> str:
    """How much stock alone moved between rounds: the noise floor of every ratio."""
    jct = [s["jct_mean_s"] for s in stock]
    span = [s["makespan_s"] for s in stock]
    return (f"stock alone (the machine's drift, not signal): mean JCT {min(jct):.2f}-{max(jct):.2f} s "
            f"(max / min {max(jct) / min(jct):.2f}x), makespan {min(span):.1f}-{max(span):.1f} s "
            f"({max(span) / min(span):.2f}x) over {len(stock)} rounds")


def round_outcomes(rounds: Sequence[Sequence[RunResult]]) -> str:
    """Each round's outcome table against that round's stock (experiments/outcomes.py)."""
    parts = []
    for i, rnd in enumerate(rounds, 1):
        table = outcome_table(rnd, "stock")
        if table:
            parts.append(f"Round {i}. {table}")
    return "\n\n".join(parts)
