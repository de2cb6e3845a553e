"""Figures, tables and plots from replay or simulation runs.

Every figure is computed from the records of a run (results.py: the replay
client and the simulator fill them alike); nothing here is hard-coded.

The agents' figures (JCT, TTFT, reuse, throughput) are computed over the
agents' programs only; one-shot requests (chat traffic without a session)
get figures of their own, TTFT and latency at p50 and p99, and tables show
them, with their ratio to the baseline's, only when a run has any: "does
pinning make everyone else wait?" is their question.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from continuum_lab.results import RunResult


def percentile(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def makespan_s(run: RunResult) -> float:
    """From the first program's arrival to the last program's end (the agents'
    batch; one-shot requests are judged by their latency)."""
    start = min((p.arrival_s for p in run.programs), default=0.0)
    end = max((p.end_s for p in run.programs), default=0.0)
    return max(1e-9, end - start)


def _mean(values) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def summarize(run: RunResult) -> dict:
    jct = [p.jct_s for p in run.programs]
    turns = run.turns
    resumed = [t for t in turns if t.turn > 0]
    prev = sum(t.prev_prompt_tokens for t in resumed)
    kept = sum(min(t.cached_tokens, t.prev_prompt_tokens) for t in resumed)
    prompt = sum(t.prompt_tokens for t in turns)
    cached = sum(t.cached_tokens for t in turns)
    output = sum(t.output_tokens for t in turns)
    makespan = makespan_s(run)
    return {
        "label": run.label,
        "programs": len(run.programs),
        "turns": len(turns),
        "errors": len(run.errors),
        "jct_mean_s": _mean(jct),
        "jct_p50_s": percentile(jct, 50),
        "jct_p95_s": percentile(jct, 95),
        "jct_p99_s": percentile(jct, 99),
        "ttft_mean_s": _mean([t.ttft_s for t in turns]),
        "ttft_p50_s": percentile([t.ttft_s for t in turns], 50),
        "ttft_p95_s": percentile([t.ttft_s for t in turns], 95),
        "ttft_p99_s": percentile([t.ttft_s for t in turns], 99),
        "ttft_resumed_mean_s": _mean([t.ttft_s for t in resumed]),
        # Of the previous turn's prompt, how much the resumed turn found cached.
        "reuse_of_prev_prompt": kept / prev if prev else float("nan"),
        "resumed_fully_reused": (
            sum(t.cached_tokens >= t.prev_prompt_tokens for t in resumed) / len(resumed)
            if resumed else float("nan")
        ),
        "prefix_hit_ratio": cached / prompt if prompt else float("nan"),
        "prompt_tokens": prompt,
        "prefilled_tokens": prompt - cached,
        "makespan_s": makespan,
        "throughput_programs_per_min": 60 * len(run.programs) / makespan,
        "throughput_tokens_per_s": (prompt + output) / makespan,
        **one_shot_summary(run),
    }


def one_shot_summary(run: RunResult) -> dict:
    """The one-shot requests' count and their TTFT and latency percentiles (NaN without any)."""
    ttft = [t.ttft_s for t in run.one_shot]
    latency = [t.latency_s for t in run.one_shot]
    return {
        "one_shot_requests": len(run.one_shot),
        "one_shot_ttft_p50_s": percentile(ttft, 50),
        "one_shot_ttft_p99_s": percentile(ttft, 99),
        "one_shot_latency_p50_s": percentile(latency, 50),
        "one_shot_latency_p99_s": percentile(latency, 99),
        "one_shot_latency_mean_s": sum(latency) / len(latency) if latency else float("nan"),
    }


COLUMNS = [
    ("label", "run", "{}"),
    ("programs", "programs", "{}"),
    ("jct_mean_s", "mean JCT s", "{:.2f}"),
    ("jct_p95_s", "p95 JCT s", "{:.2f}"),
    ("ttft_mean_s", "mean TTFT s", "{:.3f}"),
    ("reuse_of_prev_prompt", "reuse of prev prompt", "{:.1%}"),
    ("prefix_hit_ratio", "prompt cached", "{:.1%}"),
    ("prefilled_tokens", "tokens prefilled", "{}"),
    ("throughput_programs_per_min", "programs/min", "{:.2f}"),
    ("throughput_tokens_per_s", "tokens/s", "{:.1f}"),
]


# Shown when a run has one-shot requests.
ONE_SHOT_COLUMNS = [
    ("one_shot_requests", "one-shot reqs", "{}"),
    ("one_shot_ttft_p50_s", "one-shot p50 TTFT s", "{:.3f}"),
    ("one_shot_ttft_p99_s", "one-shot p99 TTFT s", "{:.3f}"),
    ("one_shot_latency_p50_s", "one-shot p50 latency s", "{:.2f}"),
    ("one_shot_latency_p99_s", "one-shot p99 latency s", "{:.2f}"),
]


def has_one_shot(summaries: Sequence[dict]) -> bool:
    return any(s.get("one_shot_requests") for s in summaries)


def ratio(num: float, den: float) -> str:
    """`1.23x`; a blank where either side is missing (a run without the traffic)."""
    return f"{num / den:.2f}x" if den and math.isfinite(num) and math.isfinite(den) else ""


def markdown_table(summaries: Sequence[dict], baseline: str | None = None, columns=COLUMNS) -> str:
    """One row per run; with a baseline, ratios: baseline mean JCT / run's, run's
    throughput / baseline's and, with one-shot traffic, run's one-shot p99 TTFT and
    latency / baseline's (above 1x: the run made the one-shot requests wait longer)."""
    base = next((s for s in summaries if s["label"] == baseline), None)
    one_shot = has_one_shot(summaries)
    columns = [*columns, *ONE_SHOT_COLUMNS] if one_shot else columns
    head = [title for _, title, _ in columns]
    if base is not None:
        head += [f"{baseline} JCT / JCT", "p95 ratio", "throughput ratio"]
        if one_shot:
            head += [f"one-shot p99 TTFT / {baseline}'s", f"one-shot p99 latency / {baseline}'s"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        cells = [fmt.format(s[key]) if s.get(key) is not None else "" for key, _, fmt in columns]
        if base is not None:
            cells += [
                ratio(base["jct_mean_s"], s["jct_mean_s"]),
                ratio(base["jct_p95_s"], s["jct_p95_s"]),
                ratio(s["throughput_programs_per_min"], base["throughput_programs_per_min"]),
            ]
            if one_shot:
                cells += [ratio(s["one_shot_ttft_p99_s"], base["one_shot_ttft_p99_s"]),
                          ratio(s["one_shot_latency_p99_s"], base["one_shot_latency_p99_s"])]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def by_turn(run: RunResult, key) -> tuple[list[int], list[float]]:
    groups: dict[int, list[float]] = defaultdict(list)
    for t in run.turns:
        value = key(t)
        if value is not None:
            groups[t.turn].append(value)
    ks = sorted(groups)
    return ks, [float(np.mean(groups[k])) for k in ks]


def plot_runs(runs: Sequence[RunResult], out_dir: Path, title: str = "") -> list[Path]:
    """JCT CDF, mean TTFT by turn, reuse of the previous prompt by turn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)

    def cdf_plot(values, xlabel: str, ylabel: str, name: str, heading: str) -> Path:
        fig, ax = plt.subplots(figsize=(6, 4))
        for run in runs:
            xs = np.sort(values(run))
            if len(xs):
                ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=run.label)
        _label(ax, xlabel, ylabel, f"{heading} {title}")
        return save_figure(fig, out_dir / name)

    paths = [cdf_plot(lambda run: [p.jct_s for p in run.programs], "job completion time (s)",
                      "fraction of programs", "jct_cdf.png", "JCT CDF")]
    if any(run.one_shot for run in runs):
        paths.append(cdf_plot(lambda run: [t.ttft_s for t in run.one_shot], "time to first token (s)",
                              "fraction of one-shot requests", "one_shot_ttft_cdf.png",
                              "One-shot TTFT CDF"))

    def by_turn_plot(key, ylabel: str, name: str, heading: str, ylim=None) -> Path:
        fig, ax = plt.subplots(figsize=(6, 4))
        for run in runs:
            ks, ys = by_turn(run, key)
            ax.plot(ks, ys, marker="o", ms=3, label=run.label)
        if ylim:
            ax.set_ylim(*ylim)
        _label(ax, "turn (0 = first)", ylabel, f"{heading} {title}")
        return save_figure(fig, out_dir / name)

    paths.append(by_turn_plot(lambda t: t.ttft_s, "mean time to first token (s)",
                              "ttft_by_turn.png", "TTFT by turn"))
    paths.append(by_turn_plot(
        lambda t: min(1.0, t.cached_tokens / t.prev_prompt_tokens) if t.prev_prompt_tokens else None,
        "cached / previous turn's prompt", "reuse_by_turn.png", "Reuse of the previous prompt",
        ylim=(-0.05, 1.05),
    ))
    return paths


def _label(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title.strip())
    ax.grid(alpha=0.3)
    ax.legend()


def save_figure(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_runs(runs: Sequence[RunResult], out_dir: Path, extra: dict | None = None) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    data = {
        "summaries": [summarize(r) for r in runs],
        "runs": [r.to_json() for r in runs],
        **(extra or {}),
    }
    path.write_text(json.dumps(data, indent=1))
    return path
