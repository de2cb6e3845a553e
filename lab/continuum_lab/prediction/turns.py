"""Every turn of every replay, measured beside predicted (predict's turns.csv).

The report's tables are means and medians; when they disagree, the turns show
where: which program, which turn, its prompt and what each side found cached.
Turns are matched by program and turn (one-shot requests included); a turn
the simulator did not run (a failed program) is left out.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from continuum_lab.prediction.tables import Pair, by_turn

TURN_COLUMNS = ("round", "flavour", "program", "turn", "tool", "prompt_tokens",
                "ttft_meas_s", "ttft_pred_s", "latency_meas_s", "latency_pred_s",
                "cached_meas", "cached_pred", "output_meas", "output_pred")


def turn_rows(pairs: Sequence[Pair]) -> list[tuple]:
    """One row per turn in TURN_COLUMNS' order, each replay's turns by send time."""
    rows = []
    for q in pairs:
        pred = by_turn(q.predicted)
        for m in sorted(by_turn(q.measured).values(), key=lambda t: t.sent_s):
            p = pred.get((m.program, m.turn))
            if p is not None:
                rows.append((q.round, q.label, m.program, m.turn, m.tool or "", m.prompt_tokens,
                             m.ttft_s, p.ttft_s, m.latency_s, p.latency_s, m.cached_tokens,
                             p.cached_tokens, m.output_tokens, p.output_tokens))
    return rows


def write_turns(pairs: Sequence[Pair], path: Path) -> Path:
    with Path(path).open("w", newline="") as f:
        csv.writer(f).writerows([TURN_COLUMNS, *turn_rows(pairs)])
    return path
