"""Predicted beside measured, per round and flavour, and what tells them apart.

- outcome_table: what the simulator must predict: mean JCT,
  makespan, reuse of the previous prompt, one-shot p99 TTFT, and the stock /
  flavour JCT ratio of the round, each with its error (predicted / measured
  - 1), predicted at the machine's speed its replays' probes measured, where
  compare probed it;
- speed_table: each replay's and the run's probed speed, and the prediction
  on the cost model as calibrated beside it;
- steps_table, where compare logged every step: the steps the server ran
  beside the simulator's, the speed it ran them at, and the prediction at
  that speed;
- diagnosis_table, where to look when they differ: TTFT of first and of
  resumed turns (queueing and prefill), decode time per output token (the
  decode step; tool turns apart, since without hints they decode under a
  grammar the simulator does not model), tokens prefilled (what the cache
  kept, by the client's count), preemptions (the engine's, which the
  client's count of prefilled tokens does not see), and the median per-turn
  TTFT ratio;
- summary_lines, per flavour over the rounds: the JCT error's range (each
  way it was predicted), whether the predicted ratio to stock is on the
  measured side of 1, and how far stock itself moved between rounds
  (measured and predicted), the noise any error must be read against.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from continuum_lab.live.flavours import STOCK
from continuum_lab.live.round_report import value_range
from continuum_lab.markdown import table
from continuum_lab.prediction.step_speed import speed_of
from continuum_lab.report import ratio, summarize
from continuum_lab.results import RunResult, TurnRecord

TARGET = 0.15  # mean-JCT prediction error within 15%


@dataclass
class Pair:
    """One replay of a round: what it measured, and its simulation."""

    round: int
    label: str  # the live flavour
    policy: str  # the simulated scheduler, in words (settings.describe)
    measured: RunResult
    predicted: RunResult  # at the speed measured beside the replay, where it was
    as_calibrated: RunResult | None = None  # on the cost model unscaled, when that differs
    at_steps: RunResult | None = None  # at the speed of the replay's own steps (step_speed.py)

    def __post_init__(self) -> None:
        self.m, self.p = summarize(self.measured), summarize(self.predicted)
        self.c = summarize(self.as_calibrated) if self.as_calibrated else None
        self.s = summarize(self.at_steps) if self.at_steps else None


def by_turn(run: RunResult) -> dict[tuple[str, int], TurnRecord]:
    """A run's turns and one-shot requests by (program, turn): how a measured turn
    finds its simulated one."""
    return {(t.program, t.turn): t for t in [*run.turns, *run.one_shot]}


def _err(pred: float, meas: float) -> float:
    return pred / meas - 1 if meas and math.isfinite(pred) and math.isfinite(meas) else float("nan")


def _f(value: float, fmt: str) -> str:
    return fmt.format(value) if isinstance(value, (int, float)) and math.isfinite(value) else ""


def _stock(pairs: Sequence[Pair], rnd: int) -> Pair | None:
    return next((q for q in pairs if q.round == rnd and q.label == STOCK), None)


def _beside(q: Pair, key: str, fmt: str, predicted: dict | None = None) -> list[str]:
    """Measured, predicted (the pair's prediction, or `predicted`) and the error of one figure."""
    p = q.p if predicted is None else predicted
    return [_f(q.m[key], fmt), _f(p[key], fmt), _f(_err(p[key], q.m[key]), "{:+.1%}")]


def outcome_table(pairs: Sequence[Pair]) -> str:
    one_shot = any(q.m["one_shot_requests"] for q in pairs)
    head = ["round", "flavour", "sim", "mean JCT s meas", "pred", "error", "makespan s meas", "pred",
            "error", "stock / JCT meas", "pred", "reuse meas", "pred"]
    head += ["one-shot p99 TTFT s meas", "pred", "error"] if one_shot else []
    rows = []
    for q in pairs:
        base = _stock(pairs, q.round)
        cells = [str(q.round), q.label, q.policy, *_beside(q, "jct_mean_s", "{:.2f}"),
                 *_beside(q, "makespan_s", "{:.1f}"),
                 ratio(base.m["jct_mean_s"], q.m["jct_mean_s"]) if base else "",
                 ratio(base.p["jct_mean_s"], q.p["jct_mean_s"]) if base else "",
                 _f(q.m["reuse_of_prev_prompt"], "{:.1%}"), _f(q.p["reuse_of_prev_prompt"], "{:.1%}")]
        if one_shot:
            cells += _beside(q, "one_shot_ttft_p99_s", "{:.3f}")
        rows.append(cells)
    return table(head, rows)


def speed_table(pairs: Sequence[Pair]) -> str:
    """Per replay: the machine's speed against the cost model, measured right before
    and after it (measured / modelled time of the probe's points), the run's (applied
    to every replay), and the mean JCT predicted as calibrated beside the prediction
    at the run's speed."""
    head = ["round", "flavour", "speed probe meas / model: before", "after", "this replay",
            "the run's (applied)", "mean JCT s meas", "pred as calibrated", "error",
            "pred at the run's speed", "error"]
    rows = [[str(q.round), q.label, *(_f(q.predicted.meta["speed"].get(k), "{:.2f}x")
                                      for k in ("before", "after", "replay", "run")),
             _f(q.m["jct_mean_s"], "{:.2f}"), *_beside(q, "jct_mean_s", "{:.2f}", q.c)[1:],
             *_beside(q, "jct_mean_s", "{:.2f}")[1:]]
            for q in pairs if q.c is not None]
    return table(head, rows) if rows else ""


def steps_table(pairs: Sequence[Pair]) -> str:
    """Per replay with a step log: the steps the server ran and the simulator's, both
    timed on the cost model as calibrated (a difference is the schedule: which steps
    ran); the live steps' measured time over that (the speed the machine ran them at,
    the decode-only steps and those with a prefill apart); and the mean JCT predicted
    at that speed."""
    head = ["round", "flavour", "steps live", "sim", "modelled s, live steps", "sim's",
            "measured s, live steps", "speed: all steps", "decode only", "with a prefill",
            "mean JCT s meas", "pred at this speed", "error"]
    rows = []
    for q in pairs:
        if q.s is None:
            continue
        live = q.at_steps.meta["live_steps"]
        sim = (q.as_calibrated or q.predicted).meta
        rows.append([
            str(q.round), q.label, str(live["all"]["steps"]), str(sim["steps"]),
            _f(live["all"]["modelled_s"], "{:.1f}"), _f(sim["busy_s"], "{:.1f}"),
            _f(live["all"]["measured_s"], "{:.1f}"),
            *(_f(speed, "{:.2f}x") for speed in (
                speed_of(live["all"]), speed_of(live.get("decode")),
                speed_of(live.get("mixed"), live.get("prefill")))),
            *_beside(q, "jct_mean_s", "{:.2f}", q.s)])
    return table(head, rows) if rows else ""


def _decode_s_per_token(run: RunResult, tool_turns: bool) -> float:
    """Median decode time per output token of the agents' tool turns, or of the other
    turns and one-shot requests. Apart, because without client hints a tool turn is
    written under a grammar (structured outputs), which the simulator does not model."""
    per = [(t.latency_s - t.ttft_s) / (t.output_tokens - 1)
           for t in [*run.turns, *run.one_shot] if t.output_tokens > 1 and bool(t.tool) == tool_turns]
    return statistics.median(per) if per else float("nan")


def _mean_ttft(run: RunResult, resumed: bool) -> float:
    """Mean TTFT of the agents' first turns (resumed=False) or of their later turns."""
    xs = [t.ttft_s for t in run.turns if (t.turn > 0) == resumed]
    return statistics.fmean(xs) if xs else float("nan")


def _turn_ttft_ratio(q: Pair) -> float:
    """Median over turns of predicted / measured TTFT, turn by turn."""
    meas = by_turn(q.measured)
    ratios = [t.ttft_s / meas[key].ttft_s for key, t in by_turn(q.predicted).items()
              if key in meas and meas[key].ttft_s > 0]
    return statistics.median(ratios) if ratios else float("nan")


# vLLM's processes by the names it gives them (setproctitle, cut to 15 characters
# by the kernel); whatever else the server's session runs is its API server.
ENGINE_PROCESSES = {"model worker": "VLLM::Worker", "engine core": "VLLM::EngineCor"}


def cores_used(cpu: dict | None) -> str:
    """'model worker W + engine core E + API server A + client C of N': the cores
    each used on average over a replay (compare's CpuMeter record), or '' for a
    run recorded without."""
    if not cpu or not cpu.get("wall_s"):
        return ""
    server = dict(cpu.get("server_s", {}))
    parts = {role: sum(server.pop(k) for k in list(server) if k.startswith(prefix))
             for role, prefix in ENGINE_PROCESSES.items()}
    parts |= {"API server": sum(server.values()), "client": cpu["client_s"]}
    return " + ".join(f"{role} {s / cpu['wall_s']:.2f}" for role, s in parts.items()) + f" of {cpu['cores']}"


def diagnosis_table(pairs: Sequence[Pair]) -> str:
    head = ["round", "flavour", "first-turn TTFT s meas", "pred", "resumed-turn TTFT s meas", "pred",
            "decode s/token, tool turns meas", "pred", "other turns meas", "pred",
            "tokens prefilled meas", "pred", "turn TTFT pred/meas (median)",
            "preemptions meas", "pred", "sim: KV pool used", "load avg before, after", "cores used (mean)"]
    rows = []
    for q in pairs:
        meta = q.predicted.meta
        rows.append([
            str(q.round), q.label,
            *(_f(_mean_ttft(r, resumed), "{:.3f}") for resumed in (False, True)
              for r in (q.measured, q.predicted)),
            *(_f(_decode_s_per_token(r, tools), "{:.4f}") for tools in (True, False)
              for r in (q.measured, q.predicted)),
            str(q.m["prefilled_tokens"]), str(q.p["prefilled_tokens"]),
            _f(_turn_ttft_ratio(q), "{:.2f}x"),
            *(str(r.meta["preemptions"]) if r.meta.get("preemptions") is not None else ""
              for r in (q.measured, q.predicted)),
            _f(meta.get("pool_usage_mean", float("nan")), "{:.0%}"),
            ", ".join(str(x) for x in q.measured.meta.get("load_average", [])),
            cores_used(q.measured.meta.get("cpu"))])
    return table(head, rows)


def _side(x: float) -> int:
    return 0 if abs(x - 1) < 1e-9 else (1 if x > 1 else -1)


def _jct_errors(pairs: Sequence[Pair], prediction: str) -> list[float]:
    """The mean-JCT errors of the pairs' predictions `p` (the report's), `c` (as
    calibrated) or `s` (at the speed of the replay's own steps)."""
    found = [_err(pred["jct_mean_s"], q.m["jct_mean_s"]) for q in pairs
             if (pred := getattr(q, prediction)) is not None]
    return [e for e in found if math.isfinite(e)]


def _flavour_line(pairs: Sequence[Pair], label: str) -> str:
    """A flavour over the rounds: its JCT error's range against TARGET and, beside
    stock, whether the predicted ratio falls on the measured side of 1."""
    mine = [q for q in pairs if q.label == label]
    errs = _jct_errors(mine, "p")
    if not errs:
        return f"{label}: no round with a mean JCT both measured and predicted"
    within = sum(abs(e) <= TARGET for e in errs)
    line = (f"{label}: mean-JCT error by round {min(errs):+.1%} to {max(errs):+.1%} "
            f"(within {TARGET:.0%} in {within} of {len(errs)} rounds)")
    if calibrated := _jct_errors(mine, "c"):
        line += (f"; on the cost model as calibrated, not scaled by the speed probes, {min(calibrated):+.1%} "
                 f"to {max(calibrated):+.1%} (within {TARGET:.0%} in {sum(abs(e) <= TARGET for e in calibrated)})")
    if own := _jct_errors(mine, "s"):
        line += (f"; at the speed of the replays' own steps {min(own):+.1%} to {max(own):+.1%} "
                 f"(within {TARGET:.0%} in {sum(abs(e) <= TARGET for e in own)})")
    bases = [(_stock(pairs, q.round), q) for q in mine if label != STOCK]
    ratios = [(b.m["jct_mean_s"] / q.m["jct_mean_s"], b.p["jct_mean_s"] / q.p["jct_mean_s"])
              for b, q in bases if b is not None]
    ratios = [(m, p) for m, p in ratios if m > 0 and p > 0]  # finite, and a mean to take
    if ratios:
        geo_m = statistics.geometric_mean(m for m, _ in ratios)
        geo_p = statistics.geometric_mean(p for _, p in ratios)
        same = sum(_side(m) == _side(p) for m, p in ratios)
        line += (f"; stock / JCT measured {geo_m:.2f}x, predicted {geo_p:.2f}x (geometric means), "
                 f"same side of 1 in {same} of {len(ratios)} rounds, overall "
                 f"{'yes' if _side(geo_m) == _side(geo_p) else 'NO'}")
    return line


def summary_lines(pairs: Sequence[Pair]) -> list[str]:
    lines = [_flavour_line(pairs, label) for label in dict.fromkeys(q.label for q in pairs)]
    stock = [q for q in pairs if q.label == STOCK]
    if len(stock) > 1:
        for what, key in (("measured", "m"), ("predicted", "p")):
            jct = [getattr(q, key)["jct_mean_s"] for q in stock]
            lines.append(f"stock's mean JCT over rounds, {what}: {value_range(jct, '{:.2f}')}")
        lines.append("(the measured spread is the machine's drift: an error or a ratio inside it is not "
                     "signal; the predicted spread comes from the rounds' sent traces alone)")
    return lines
